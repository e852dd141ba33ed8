"""Option types shared by run, chat, serve and bench, so names and defaults agree everywhere."""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Optional

import typer

ModelArg = Annotated[str, typer.Argument(help="alias from models.yaml, owner/repo[:QUANT], or a path to a .gguf file")]

_S = "Sampling"
TemperatureOpt = Annotated[Optional[float], typer.Option("--temperature", "-t", help="0 = greedy", rich_help_panel=_S)]
TopKOpt = Annotated[Optional[int], typer.Option("--top-k", help="0 disables", rich_help_panel=_S)]
TopPOpt = Annotated[Optional[float], typer.Option("--top-p", help="1.0 disables", rich_help_panel=_S)]
MinPOpt = Annotated[Optional[float], typer.Option("--min-p", help="0 disables", rich_help_panel=_S)]
TypicalPOpt = Annotated[Optional[float], typer.Option("--typical-p", help="1.0 disables", rich_help_panel=_S)]
RepeatPenaltyOpt = Annotated[Optional[float], typer.Option("--repeat-penalty", help="1.0 disables", rich_help_panel=_S)]
RepeatLastNOpt = Annotated[Optional[int], typer.Option("--repeat-last-n", help="-1 = whole context", rich_help_panel=_S)]
PresencePenaltyOpt = Annotated[Optional[float], typer.Option("--presence-penalty", rich_help_panel=_S)]
FrequencyPenaltyOpt = Annotated[Optional[float], typer.Option("--frequency-penalty", rich_help_panel=_S)]
MirostatOpt = Annotated[Optional[int], typer.Option("--mirostat", help="1 or 2; 0 off", rich_help_panel=_S)]
MirostatTauOpt = Annotated[Optional[float], typer.Option("--mirostat-tau", rich_help_panel=_S)]
MirostatEtaOpt = Annotated[Optional[float], typer.Option("--mirostat-eta", rich_help_panel=_S)]
SeedOpt = Annotated[Optional[int], typer.Option("--seed", help="same seed, same output", rich_help_panel=_S)]
MaxTokensOpt = Annotated[Optional[int], typer.Option("--max-tokens", "-n", help="-1 = until the context is full", rich_help_panel=_S)]
MinTokensOpt = Annotated[Optional[int], typer.Option("--min-tokens", help="suppress end-of-text until this many", rich_help_panel=_S)]
LogitBiasOpt = Annotated[Optional[list[str]], typer.Option("--logit-bias", help="TOKEN_ID=BIAS (repeatable)", rich_help_panel=_S)]
StopOpt = Annotated[Optional[list[str]], typer.Option("--stop", "-s", help="stop sequence (repeatable)", rich_help_panel=_S)]
GrammarOpt = Annotated[Optional[Path], typer.Option("--grammar", help="GBNF grammar file", rich_help_panel=_S)]
JsonSchemaOpt = Annotated[Optional[Path], typer.Option("--json-schema", help="JSON schema file for the output", rich_help_panel=_S)]

_M = "Model and hardware"
CtxOpt = Annotated[Optional[int], typer.Option("--ctx", "-c", help="context window (tokens); default from models.yaml", rich_help_panel=_M)]
GpuLayersOpt = Annotated[str, typer.Option("--gpu-layers", help="layers to offload to the GPU: N, auto (all, on a GPU build) or 0", rich_help_panel=_M)]
FlashAttnOpt = Annotated[Optional[bool], typer.Option("--flash-attn/--no-flash-attn", help="default: llama.cpp decides", rich_help_panel=_M)]
KvTypeOpt = Annotated[str, typer.Option("--kv-type", help="KV cache type: f16, q8_0 or q4_0", rich_help_panel=_M)]
ThreadsOpt = Annotated[Optional[int], typer.Option("--threads", help="CPU threads (default: all available)", rich_help_panel=_M)]
BatchOpt = Annotated[int, typer.Option("--batch", help="prompt tokens per decode call", rich_help_panel=_M)]
SourceOpt = Annotated[str, typer.Option("--source", help="auto (Hub, else mirror), hub or mirror")]


_D = "Decoding"
DraftOpt = Annotated[Optional[str], typer.Option("--draft", help="speculative decoding: lookup (prompt n-grams) or a draft MODEL with the same vocabulary", rich_help_panel=_D)]
DraftMaxOpt = Annotated[int, typer.Option("--draft-max", help="most tokens drafted per step (adapts below it)", rich_help_panel=_D)]
BeamsOpt = Annotated[int, typer.Option("--beams", help="beam search with N beams (deterministic; 1 = off)", rich_help_panel=_D)]
LengthPenaltyOpt = Annotated[float, typer.Option("--length-penalty", help="beam score = logprob / length**P", rich_help_panel=_D)]


def _generation(
    source: SourceOpt = "auto",
    temperature: TemperatureOpt = None, top_k: TopKOpt = None, top_p: TopPOpt = None, min_p: MinPOpt = None,
    typical_p: TypicalPOpt = None, repeat_penalty: RepeatPenaltyOpt = None, repeat_last_n: RepeatLastNOpt = None,
    presence_penalty: PresencePenaltyOpt = None, frequency_penalty: FrequencyPenaltyOpt = None,
    mirostat: MirostatOpt = None, mirostat_tau: MirostatTauOpt = None, mirostat_eta: MirostatEtaOpt = None,
    seed: SeedOpt = None, max_tokens: MaxTokensOpt = None, min_tokens: MinTokensOpt = None,
    logit_bias: LogitBiasOpt = None, stop: StopOpt = None, grammar: GrammarOpt = None, json_schema: JsonSchemaOpt = None,
    ctx: CtxOpt = None, gpu_layers: GpuLayersOpt = "auto", flash_attn: FlashAttnOpt = None, kv_type: KvTypeOpt = "f16",
    threads: ThreadsOpt = None, batch: BatchOpt = 512,
) -> None:
    """The options run, chat and serve share: where the model comes from, sampling, model and hardware."""


def _decoding(
    draft: DraftOpt = None, draft_max: DraftMaxOpt = 8, beams: BeamsOpt = 1, length_penalty: LengthPenaltyOpt = 1.0,
) -> None:
    """The decoding strategy options run and chat share."""


def shared_options(*, decoding: bool = False) -> Callable[[Callable], Callable]:
    """Give a Typer command the shared options (after its own), passed to it as keyword arguments
    (its `**options`). Typer reads a command's parameters from its signature, so one list serves all."""
    templates = [_generation, _decoding] if decoding else [_generation]
    extra = [p for t in templates for p in inspect.signature(t, eval_str=True).parameters.values()]

    def decorate(command: Callable) -> Callable:
        own = inspect.signature(command, eval_str=True)
        params = [p for p in own.parameters.values() if p.kind is not p.VAR_KEYWORD] + extra

        @functools.wraps(command)
        def with_options(**kwargs):
            return command(**kwargs)

        with_options.__signature__ = own.replace(parameters=params)
        with_options.__annotations__ = {p.name: p.annotation for p in params}
        return with_options

    return decorate
