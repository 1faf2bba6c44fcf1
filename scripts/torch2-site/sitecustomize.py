# Loaded by scripts/torch2-python only: a test-environment fix for a packaging defect of Debian
# 13's torch 2.6, not something ddprun needs (pip's torch has libuv). That build lacks libuv,
# yet TCPStore still defaults to use_libuv=True, so every store a worker makes through
# torch.distributed.rendezvous (init_process_group's env:// path, which passes no use_libuv)
# fails with "use_libuv was requested but PyTorch was build without libuv support", and so does
# torchrun's own store (dynamic_rendezvous calls torch.distributed.TCPStore, the c10d rendezvous
# backend its imported TCPStore, neither with use_libuv). Here the TCPStore of each of those
# modules becomes a subclass that defaults use_libuv to False (a subclass rather than a function,
# so what it makes is still an instance of torch's own TCPStore class). Each module is patched
# when it is first imported, so Python programs that never import torch pay nothing.
import importlib.abc
import sys

_TARGETS = (
    "torch.distributed",
    "torch.distributed.rendezvous",
    "torch.distributed.elastic.rendezvous.c10d_rendezvous_backend",
)


def _patch(module):
    real = module.TCPStore
    if getattr(real, "_libuv_off_by_default", False):
        return

    class TCPStore(real):
        _libuv_off_by_default = True

        def __init__(self, *args, **kwargs):
            kwargs.setdefault("use_libuv", False)
            super().__init__(*args, **kwargs)

    module.TCPStore = TCPStore


class _PatchOnImport(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name not in _TARGETS:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(name, path, target)
            if spec is not None:
                break
        else:
            return None
        exec_module = spec.loader.exec_module

        def exec_and_patch(module):
            exec_module(module)
            _patch(module)

        spec.loader.exec_module = exec_and_patch
        return spec


sys.meta_path.insert(0, _PatchOnImport())


# Python imports one sitecustomize: this one comes first on PYTHONPATH, so it runs the next one
# (ddprun's hook for its Python workers, agent/hang/python/python_hook.h, or the user's) as that one runs
# the one after it.
def _chain():
    import importlib.machinery
    import importlib.util
    import os

    here = os.path.dirname(os.path.abspath(__file__))
    mine = [i for i, p in enumerate(sys.path) if os.path.abspath(p or os.curdir) == here]
    rest = sys.path[mine[0] + 1:] if mine else []
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", rest)
    if spec is None or spec.loader is None:
        return
    module = importlib.util.module_from_spec(spec)
    sys.modules["sitecustomize"] = module
    spec.loader.exec_module(module)


_chain()
