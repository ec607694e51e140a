"""``keras.callbacks`` on ferrokeras: ``TensorBoard`` without TensorFlow.

Keras 2.3.1's ``keras.callbacks.TensorBoard`` imports TensorFlow and raises without it.
When Keras runs on ferrokeras and TensorFlow is not installed, ``keras.callbacks.TensorBoard``
is ``ferrokeras.callbacks.TensorBoard``, which writes the event files with the
``tensorboard`` package alone.
"""

import importlib.util


def patch_callbacks(module):
    """Points ``module.TensorBoard`` (``module`` is ``keras.callbacks``) at ferrokeras's
    when TensorFlow cannot be imported; with TensorFlow installed Keras's own is kept."""
    try:
        has_tf = importlib.util.find_spec("tensorflow") is not None
    except (ImportError, ValueError):
        has_tf = False
    if has_tf:
        return
    from ..callbacks import TensorBoard

    module.TensorBoard = TensorBoard
