"""The Keras backend API (``K``) on the ferrokeras graph engine.

Every function here either builds graph nodes from the primitives in ``ferrokeras._core``
or composes other ``K`` functions; nothing runs until a value is asked for (``eval``,
``get_value``, ``np.asarray`` or a ``function`` call). Signatures follow the Keras backend
documentation; where it is silent, behaviour follows ``tf.keras.backend`` and Keras 2.3.1.
The functions live in ``ferrokeras._k``, one module per family; this module re-exports them.
"""

# isort: skip_file

from ._k.conv import *  # noqa: F401,F403
from ._k.control import *  # noqa: F401,F403
from ._k.ctc import *  # noqa: F401,F403
from ._k.function import *  # noqa: F401,F403
from ._k.layout import *  # noqa: F401,F403
from ._k.linalg import *  # noqa: F401,F403
from ._k.math import *  # noqa: F401,F403
from ._k.nn import *  # noqa: F401,F403
from ._k.pyfunc import *  # noqa: F401,F403
from ._k.random import *  # noqa: F401,F403
from ._k.rnn import *  # noqa: F401,F403
from ._k.session import *  # noqa: F401,F403
from ._k.sparse import *  # noqa: F401,F403
from ._k.variables import *  # noqa: F401,F403
from ._k.function import Function  # noqa: F401
from ._k.linalg import _matmul  # noqa: F401  (used by Tensor.__matmul__)
from .config import (  # noqa: F401
    epsilon,
    floatx,
    get_uid,
    image_data_format,
    manual_variable_initialization,
    normalize_data_format,
    reset_uids,
    set_epsilon,
    set_floatx,
    set_image_data_format,
)
from .tensor import Tensor, Variable, is_tensor  # noqa: F401

# Keep last: Keras-only names, the Python 3.10+/NumPy 2 shims Keras 2.3.1 needs, and stubs
# for the names Keras imports that no family above provides yet.
from ._k.keras_compat import *  # noqa: F401,F403,E402
