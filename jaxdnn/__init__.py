"""jaxdnn: cuDNN-class convolution, pooling, activation and softmax primitives for JAX, on C++
and CUDA kernels via the XLA FFI.

    import jaxdnn
    y = jaxdnn.conv(x, w, (1, 1), "SAME", dimension_numbers=("NHWC", "HWIO", "NHWC"),
                    algo="direct")

`jaxdnn.conv` takes exactly jax.lax.conv_general_dilated's arguments plus `algo`, and composes
with jit, vmap and grad of any order.
"""

from jaxdnn._src import ffi as _ffi

_ffi.load_cpu_extension()  # raises ImportError on an FFI API mismatch with the running jaxlib

from jaxdnn._src.algorithms import ConvAlgo, MathPrecision, TiledAlgo  # noqa: E402
from jaxdnn._src.geometry import ConvGeometry, ConvOp, Layout  # noqa: E402
from jaxdnn.activations import (  # noqa: E402
    activation,
    clipped_relu,
    elu,
    gelu,
    identity,
    leaky_relu,
    log_softmax,
    relu,
    relu6,
    sigmoid,
    silu,
    softmax,
    swish,
    tanh,
)
from jaxdnn._src.primitives.conv import (  # noqa: E402
    conv_backward_data,
    conv_backward_filter,
    conv_forward,
)
from jaxdnn.conv import conv  # noqa: E402
from jaxdnn.conv_transpose import conv_transpose  # noqa: E402
from jaxdnn.pooling import avg_pool, global_avg_pool, global_max_pool, max_pool  # noqa: E402

__version__ = "0.1.0"

__all__ = [
    "ConvAlgo",
    "ConvGeometry",
    "ConvOp",
    "Layout",
    "MathPrecision",
    "TiledAlgo",
    "activation",
    "avg_pool",
    "clipped_relu",
    "conv",
    "conv_backward_data",
    "conv_backward_filter",
    "conv_forward",
    "conv_transpose",
    "elu",
    "gelu",
    "global_avg_pool",
    "global_max_pool",
    "identity",
    "leaky_relu",
    "log_softmax",
    "max_pool",
    "relu",
    "relu6",
    "sigmoid",
    "silu",
    "softmax",
    "swish",
    "tanh",
]
