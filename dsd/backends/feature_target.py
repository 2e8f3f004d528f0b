"""The target of a feature-draft pair (the verifier's model): a TorchLM that keeps, for every
position a pass computed, the feature its draft reads (dsd.features.ProvidesFeatures). The
feature is one layer's output, or the draft's ``fuse`` of several layers' outputs, computed here
where the target runs, so only d values a position travel to the edge."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from dsd.backends.eagle_model import WEIGHTS_FILE, EagleConfig
from dsd.backends.protocol import LogitsRequest
from dsd.backends.torch_lm import DTYPES, TorchLM, TorchLMConfig, load_model
from dsd.backends.vocab_map import VocabMap
from dsd.features import FeatureBlock

if TYPE_CHECKING:
    from transformers import PreTrainedModel


class LayerTap:
    """Forward hooks that keep the outputs of some of a transformers model's decoder layers."""

    def __init__(self, model: PreTrainedModel, layers: Sequence[int]) -> None:
        self.layers = tuple(layers)
        self.outputs: dict[int, torch.Tensor] = {}
        decoder: Any = model.model  # nn.Module.__getattr__ types a submodule as Tensor | Module
        blocks = decoder.layers
        self._handles = [blocks[i].register_forward_hook(self._keeper(i)) for i in self.layers]

    def _keeper(self, index: int) -> Callable[[torch.nn.Module, object, object], None]:
        def keep(_module: torch.nn.Module, _inputs: object, output: object) -> None:
            kept = output[0] if isinstance(output, tuple) else output
            if not isinstance(kept, torch.Tensor):
                raise TypeError(f"decoder layer {index} returned {type(kept).__name__}, not a tensor")
            self.outputs[index] = kept

        return keep

    def stacked(self) -> torch.Tensor:
        """[..., layers, d]: the last forward's outputs of the tapped layers."""
        return torch.stack([self.outputs[i] for i in self.layers], dim=-2)

    def close(self) -> None:
        for handle in self._handles:
            handle.remove()


class FeatureTorchLM(TorchLM):
    """A TorchLM and ProvidesFeatures: rows [positions, d] per sequence, valid up to its cache."""

    def __init__(
        self,
        model: PreTrainedModel,
        name: str,
        eos_token_id: int | None,
        feature_layers: Sequence[int],
        fuse: torch.nn.Linear | None,
        vocab_map: VocabMap | None = None,
    ) -> None:
        super().__init__(model, name, eos_token_id, vocab_map)
        if fuse is None and len(feature_layers) != 1:
            raise ValueError(f"features of {len(feature_layers)} layers need the draft's fuse weights")
        self._tap = LayerTap(model, feature_layers)
        self._fuse = fuse
        self._features: dict[str, torch.Tensor] = {}

    @classmethod
    def load_for_draft(cls, config: TorchLMConfig, draft_folder: str | Path) -> FeatureTorchLM:
        """The target at config.path, tapped at the layers the draft in draft_folder reads."""
        import safetensors.torch

        eagle = EagleConfig.load(draft_folder)
        model, choice = load_model(config)
        fuse = None
        if eagle.fused:
            weight = safetensors.torch.load_file(str(Path(draft_folder) / WEIGHTS_FILE))["fuse.weight"]
            fuse = torch.nn.Linear(weight.shape[1], weight.shape[0], bias=False)
            fuse.weight.data = weight.to(DTYPES[config.dtype]).to(config.device)
        lm = cls(
            model,
            Path(config.path).name,
            model.config.eos_token_id,
            eagle.feature_layers,
            fuse,
            VocabMap.load(config.path),
        )
        lm.kernel_choice = choice
        return lm

    @property
    def feature_width(self) -> int:
        return int(self.model.config.hidden_size)

    @torch.inference_mode()
    def _after_pass(self, requests: Sequence[LogitsRequest], starts: list[int], lengths: list[int]) -> None:
        stacked = self._tap.stacked()[0]  # [T, layers, d]
        rows = stacked[:, 0] if self._fuse is None else self._fuse(stacked.flatten(-2))  # [T, d]
        offset = 0
        for r, start, n in zip(requests, starts, lengths):
            buffer = self._features.get(r.seq_id)
            if buffer is None or buffer.shape[0] < start + n:
                grown = rows.new_zeros(
                    max(start + n, 64, 2 * (0 if buffer is None else buffer.shape[0])), rows.shape[1]
                )
                if buffer is not None:
                    grown[: buffer.shape[0]] = buffer
                buffer = self._features[r.seq_id] = grown
            buffer[start : start + n] = rows[offset : offset + n]
            offset += n

    def features(self, seq_id: str, start: int, end: int) -> FeatureBlock:
        if not 0 <= start <= end <= self.cached_length(seq_id):
            raise ValueError(
                f"{seq_id}: features {start}..{end - 1} asked, positions 0..{self.cached_length(seq_id) - 1} computed"
            )
        rows = self._features[seq_id][start:end] if end > start else torch.zeros(0, self.feature_width)
        return FeatureBlock(start, rows.float())

    def release(self, seq_id: str) -> None:
        super().release(seq_id)
        self._features.pop(seq_id, None)
