"""The line of a test file marked `# <name>` at its end, for tests of the lines that
warnings and errors name."""


def marked_line(path, marker):
    with open(path) as fh:
        hits = [i for i, text in enumerate(fh, 1) if text.rstrip().endswith(f"# <{marker}>")]
    assert len(hits) == 1, marker
    return hits[0]
