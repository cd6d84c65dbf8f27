"""tracejit.utils: DeZero's utilities: gradient checking, array comparison, graph drawing,
and the download cache the datasets use (get_file, show_progress).

Eager-layer helpers with no part in tracing. numerical_grad and gradient_check follow
DeZero's signatures so DeZero tests run unchanged (tracejit.testing.gradcheck is the
richer checker that also covers the JIT). get_dot_graph writes the autodiff graph of
an eager result in DeZero's DOT format; a jitted result's graph is `fn.trace(...)`.
"""
import os
import shutil
import subprocess
import sys

import numpy as np

from tracejit.core import Variable, as_variable


# ---------------------------------------------------------------- graph drawing

def _dot_var(v, verbose=False):
    dot_var = '{} [label="{}", color=orange, style=filled]\n'
    name = "" if v.name is None else v.name
    if verbose and v.data is not None:
        if v.name is not None:
            name += ": "
        name += str(v.shape) + " " + str(v.dtype)
    return dot_var.format(id(v), name)


def _dot_func(f):
    dot_func = '{} [label="{}", color=lightblue, style=filled, shape=box]\n'
    ret = dot_func.format(id(f), f.__class__.__name__)
    dot_edge = "{} -> {}\n"
    for x in f.inputs:
        ret += dot_edge.format(id(x), id(f))
    for y in f.outputs:
        y = y()
        if y is not None:  # an output nobody kept has been freed: no node to point at
            ret += dot_edge.format(id(f), id(y))
    return ret


def get_dot_graph(output, verbose=True):
    """The graph that produced `output`, as Graphviz DOT text (DeZero's format).

    Variables are orange ellipses labelled with their name (and shape and dtype when
    verbose), functions light-blue boxes labelled with their class name.
    """
    txt = ""
    funcs = []
    seen_set = set()

    def add_func(f):
        if f not in seen_set:
            funcs.append(f)
            seen_set.add(f)

    if output.creator is not None:
        add_func(output.creator)
    txt += _dot_var(output, verbose)

    while funcs:
        func = funcs.pop()
        txt += _dot_func(func)
        for x in func.inputs:
            txt += _dot_var(x, verbose)
            if x.creator is not None:
                add_func(x.creator)

    return "digraph g {\n" + txt + "}"


def plot_dot_graph(output, verbose=True, to_file="graph.png"):
    """Write the graph's DOT text beside `to_file` and render it with Graphviz's `dot`.

    The format is to_file's extension (png, pdf, svg, ...). The .dot file is written
    first, so when `dot` is missing the RuntimeError can point at text the user can
    render elsewhere. Returns an IPython Image when IPython is installed, else None.
    """
    dot_graph = get_dot_graph(output, verbose)
    graph_path = os.path.splitext(to_file)[0] + ".dot"
    if os.path.abspath(graph_path) == os.path.abspath(to_file):
        graph_path = to_file + ".dot"
    with open(graph_path, "w") as f:
        f.write(dot_graph)

    dot = shutil.which("dot")
    if dot is None:
        raise RuntimeError(
            f"plot_dot_graph: Graphviz's `dot` program is not installed (not found on "
            f"PATH), so {to_file} was not drawn. The graph's DOT text was written to "
            f"{os.path.abspath(graph_path)}; install Graphviz (e.g. `apt install "
            f"graphviz`) or render that file elsewhere, or use get_dot_graph().")
    extension = os.path.splitext(to_file)[1][1:] or "png"
    subprocess.run([dot, graph_path, "-T", extension, "-o", to_file], check=True)

    try:
        from IPython import display
    except ImportError:
        return None
    return display.Image(filename=to_file)


# ---------------------------------------------------------------- ndarray helpers

def sum_to(x, shape):
    """Sum the ndarray x down to `shape` (the reverse of broadcasting)."""
    ndim = len(shape)
    lead = x.ndim - ndim
    lead_axis = tuple(range(lead))
    axis = tuple([i + lead for i, sx in enumerate(shape) if sx == 1])
    y = x.sum(lead_axis + axis, keepdims=True)
    if lead > 0:
        y = y.squeeze(lead_axis)
    return y


def reshape_sum_backward(gy, x_shape, axis, keepdims):
    """Reshape a sum's gradient so it broadcasts back to the input's shape."""
    ndim = len(x_shape)
    tupled_axis = axis
    if axis is None:
        tupled_axis = None
    elif not isinstance(axis, tuple):
        tupled_axis = (axis,)

    if not (ndim == 0 or tupled_axis is None or keepdims):
        actual_axis = [a if a >= 0 else a + ndim for a in tupled_axis]
        shape = list(gy.shape)
        for a in sorted(actual_axis):
            shape.insert(a, 1)
    else:
        shape = gy.shape
    return gy.reshape(shape)


def logsumexp(x, axis=1):
    """log(sum(exp(x), axis)) with keepdims, on ndarrays."""
    # Subtract the max first: exp overflows past ~709 in float64.
    m = x.max(axis=axis, keepdims=True)
    y = x - m
    np.exp(y, out=y)
    s = y.sum(axis=axis, keepdims=True)
    np.log(s, out=s)
    m += s
    return m


def max_backward_shape(x, axis):
    """The shape of max(x, axis) with the reduced axes kept as 1."""
    if axis is None:
        axis = range(x.ndim)
    elif isinstance(axis, int):
        axis = (axis,)
    return [s if ax not in axis else 1 for ax, s in enumerate(x.shape)]


def pair(x):
    if isinstance(x, int):
        return (x, x)
    if isinstance(x, tuple):
        if len(x) != 2:
            raise ValueError(f"pair: expected an int or a 2-tuple, got {x!r}")
        return x
    raise ValueError(f"pair: expected an int or a 2-tuple, got {x!r}")


def get_conv_outsize(input_size, kernel_size, stride, pad):
    return (input_size + pad * 2 - kernel_size) // stride + 1


def get_deconv_outsize(size, k, s, p):
    return s * (size - 1) + k - 2 * p


# ---------------------------------------------------------------- gradient check

def gradient_check(f, x, *args, rtol=1e-4, atol=1e-5, **kwargs):
    """True when backprop's gradient of f at x matches central differences.

    x is converted to float64 (in place, when it is a Variable), as in DeZero.
    On a mismatch it prints both gradients' first values and returns False.
    """
    x = as_variable(x)
    x.data = x.data.astype(np.float64)

    num_grad = numerical_grad(f, x, *args, **kwargs)
    y = f(x, *args, **kwargs)
    y.backward()
    bp_grad = x.grad.data

    assert bp_grad.shape == num_grad.shape
    res = array_allclose(num_grad, bp_grad, atol=atol, rtol=rtol)

    if not res:
        print("")
        print("========== FAILED (Gradient Check) ==========")
        print("Numerical Grad")
        print(" shape: {}".format(num_grad.shape))
        val = str(num_grad.flatten()[:10])
        print(" values: {} ...".format(val[1:-1]))
        print("Backprop Grad")
        print(" shape: {}".format(bp_grad.shape))
        val = str(bp_grad.flatten()[:10])
        print(" values: {} ...".format(val[1:-1]))
    return res


def numerical_grad(f, x, *args, **kwargs):
    """d sum(f(x)) / dx by central differences with eps = 1e-4 (DeZero's).

    f receives the ndarray x (perturbed in place, one element at a time, and
    restored), then *args and **kwargs; it may return a Variable or an ndarray.
    """
    eps = 1e-4

    x = x.data if isinstance(x, Variable) else x
    grad = np.zeros_like(x)

    it = np.nditer(x, flags=["multi_index"], op_flags=["readwrite"])
    while not it.finished:
        idx = it.multi_index
        tmp_val = x[idx].copy()

        x[idx] = tmp_val + eps
        y1 = f(x, *args, **kwargs)  # f(x+h)
        if isinstance(y1, Variable):
            y1 = y1.data
        y1 = y1.copy()

        x[idx] = tmp_val - eps
        y2 = f(x, *args, **kwargs)  # f(x-h)
        if isinstance(y2, Variable):
            y2 = y2.data
        y2 = y2.copy()

        diff = (y1 - y2).sum()
        grad[idx] = diff / (2 * eps)

        x[idx] = tmp_val
        it.iternext()
    return grad


def array_equal(a, b):
    """np.array_equal on Variables or ndarrays."""
    a = a.data if isinstance(a, Variable) else a
    b = b.data if isinstance(b, Variable) else b
    return np.array_equal(a, b)


def array_allclose(a, b, rtol=1e-4, atol=1e-5):
    """np.allclose on Variables or ndarrays (DeZero's default tolerances)."""
    a = a.data if isinstance(a, Variable) else a
    b = b.data if isinstance(b, Variable) else b
    return np.allclose(a, b, atol=atol, rtol=rtol)


# ---------------------------------------------------------------- download cache

# DeZero's cache directory. The environment variable TRACEJIT_DATA, read at each call,
# overrides it, so a test or a machine without a writable home can point elsewhere.
cache_dir = os.path.join(os.path.expanduser("~"), ".dezero")

# Seconds a stalled connection may wait before the download gives up. urlretrieve has
# no timeout, and a machine without a network must get an error, not a hang.
download_timeout = 30.0


class DownloadError(OSError):
    """A file get_file needed is not in the cache and could not be downloaded."""


def get_cache_dir():
    """The directory get_file downloads into: $TRACEJIT_DATA, else utils.cache_dir."""
    return os.environ.get("TRACEJIT_DATA") or cache_dir


def show_progress(block_num, block_size, total_size):
    """Print a 30-column progress bar (DeZero's urlretrieve reporthook signature)."""
    downloaded = block_num * block_size
    if total_size <= 0:
        # The server sent no Content-Length: report bytes, not a percentage.
        print("\r[{}] {:d} bytes".format("." * 30, downloaded), end="")
        return
    p = min(downloaded / total_size * 100, 100.0)
    i = min(int(downloaded / total_size * 30), 30)
    bar = "#" * i + "." * (30 - i)
    print("\r[{}] {:.2f}%".format(bar, p), end="")


def _download(url, file_path, reporthook, timeout):
    # urlretrieve with a timeout. The bytes go to a .part file renamed into place only
    # when complete, so an interrupted download never leaves a file a later call would
    # trust as cached.
    part = file_path + ".part"
    try:
        import urllib.request   # here, not at import: 20 ms of every start-up
        with urllib.request.urlopen(url, timeout=timeout) as response, \
                open(part, "wb") as out:
            total = int(response.headers.get("Content-Length") or -1)
            block_size = 1024 * 64
            block_num = 0
            reporthook(block_num, block_size, total)
            while True:
                chunk = response.read(block_size)
                if not chunk:
                    break
                out.write(chunk)
                block_num += 1
                reporthook(block_num, block_size, total)
        os.replace(part, file_path)
    except BaseException:
        if os.path.exists(part):
            os.remove(part)
        raise


def get_file(url, file_name=None):
    """The local path of the file at `url`, downloading it into the cache if absent.

    The file is saved in the cache directory (~/.dezero, or $TRACEJIT_DATA) under
    `file_name`, by default the URL's last path component. A file already there is
    used without touching the network. When the download fails (no network, a
    timeout, an HTTP error) DownloadError names the file, the URL and the path to
    put a copy at.
    """
    if file_name is None:
        file_name = url[url.rfind("/") + 1:]
    directory = get_cache_dir()
    file_path = os.path.join(directory, file_name)
    if os.path.exists(file_path):
        return file_path
    os.makedirs(directory, exist_ok=True)

    print("Downloading: " + file_name)
    try:
        _download(url, file_path, show_progress, download_timeout)
    except (OSError, ValueError) as e:      # urllib's URLError is an OSError
        # URLError covers DNS failures and refused connections, socket.timeout (an
        # OSError) a stalled one, HTTPError (a URLError) a missing page.
        reason = getattr(e, "reason", None) or e
        raise DownloadError(
            f"could not download {file_name} from {url} ({reason}). Without a network, "
            f"download it on another machine and copy it to {file_path} (the cache "
            f"directory; set TRACEJIT_DATA to use another directory).") from e
    print(" Done")
    sys.stdout.flush()
    return file_path
