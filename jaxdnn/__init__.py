"""jaxdnn: cuDNN-class convolution and pooling primitives for JAX, on C++ and CUDA kernels via
the XLA FFI.

    import jaxdnn
    y = jaxdnn.conv(x, w, (1, 1), "SAME", dimension_numbers=("NHWC", "HWIO", "NHWC"),
                    algo="direct")

`jaxdnn.conv` takes exactly jax.lax.conv_general_dilated's arguments plus `algo`, and composes
with jit, vmap and grad of any order.
"""

from jaxdnn._src import ffi as _ffi

_ffi.load_cpu_extension()  # raises ImportError on an FFI API mismatch with the running jaxlib

from jaxdnn._src.algorithms import ConvAlgo, MathPrecision  # noqa: E402
from jaxdnn._src.geometry import ConvGeometry, ConvOp, Layout  # noqa: E402
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
    "avg_pool",
    "conv",
    "conv_backward_data",
    "conv_backward_filter",
    "conv_forward",
    "conv_transpose",
    "global_avg_pool",
    "global_max_pool",
    "max_pool",
]
