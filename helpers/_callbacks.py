"""Trainer callbacks that cost nothing to import.

A `TrainerCallback` subclass needs transformers at class-creation time, and importing transformers
takes seconds (and, through peft, bitsandbytes, which stops accelerate's notebook_launcher). So the
kit writes each callback's behaviour as a plain mixin and builds the real class on first use.
"""

from __future__ import annotations


def lazy_callbacks(namespace: dict, **mixins):
    """Return a module's (`__getattr__`, `__dir__`) that build `name = mixin + TrainerCallback` on first use.

    Example:
        >>> __getattr__, __dir__ = lazy_callbacks(globals(), LiveMemoryCallback=_LiveReadout)  # doctest: +SKIP
    """

    def __getattr__(name):
        if name not in mixins:
            raise AttributeError(f"module {namespace['__name__']!r} has no attribute {name!r}")
        from transformers import TrainerCallback

        mixin = mixins[name]
        cls = type(
            name,
            (mixin, TrainerCallback),
            {"__doc__": mixin.__doc__, "__module__": namespace["__name__"], "__qualname__": name},
        )
        namespace[name] = cls  # built once
        return cls

    def __dir__():  # tab completion lists the callbacks before their first use
        return sorted(set(namespace) | set(mixins))

    return __getattr__, __dir__
