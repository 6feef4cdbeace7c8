"""Replacing an attribute of PyTorch's with a wrapper of it, once.

Where PyTorch's Python layer gets a renamed PrivateUse1 device wrong, torch_fl
wraps the function at fault. ``import torch_fl`` may run its setup again (a
failed import is retried), and a wrapper must never wrap itself.
"""


def wrap_once(owner, name: str, make_wrapper) -> None:
    """Sets ``owner.name`` to ``make_wrapper(original)`` unless it is ours already."""
    original = getattr(owner, name)
    if getattr(original, "_flagos_wrapped", False):
        return
    wrapper = make_wrapper(original)
    wrapper._flagos_wrapped = True
    setattr(owner, name, wrapper)
