# Loaded by scripts/torch2-python only: a test-environment fix for a packaging defect of Debian
# 13's torch 2.6, not something ddprun needs (pip's torch has libuv). That build lacks libuv,
# yet TCPStore still defaults to use_libuv=True, so every store a worker makes through
# torch.distributed.rendezvous (init_process_group's env:// path, which passes no use_libuv)
# fails with "use_libuv was requested but PyTorch was build without libuv support".
# Here that module's TCPStore defaults to use_libuv=False. The module is patched when it is
# first imported, so Python programs that never import torch pay nothing.
import importlib.abc
import sys

_TARGET = "torch.distributed.rendezvous"


def _patch(module):
    real = module.TCPStore

    def TCPStore(*args, **kwargs):
        kwargs.setdefault("use_libuv", False)
        return real(*args, **kwargs)

    module.TCPStore = TCPStore


class _PatchOnImport(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name != _TARGET:
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
