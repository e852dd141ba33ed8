"""Option types shared by run, chat, serve and bench, so names and defaults agree everywhere; the sampling
options come from SamplingOptions itself."""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Optional

import typer

from ..runtime.options import LoadSpec

# The load flags' defaults are the one load type's (a flag is a LoadSpec field of its name: cli.main._load_spec).
DEFAULT_LOAD = LoadSpec()

ModelArg = Annotated[str, typer.Argument(help="alias from models.yaml, owner/repo[:QUANT], or a path to a .gguf file")]

_M = "Model and hardware"


def _context_size(value: Optional[int]) -> Optional[int]:
    """--ctx checked as it is read, before anything loads or the background server is asked (a 0 there
    reloaded the model the server held, then failed; 10 passed there as 4 slots' 40). The floor is the
    engine's (engine.options.check_context), for one slot; the error table names it --ctx."""
    if value is not None:
        from ..runtime.options import check_context

        check_context(value)
    return value


CtxOpt = Annotated[Optional[int], typer.Option("--ctx", "-c", help="context window (tokens a request may fill, at least 16; the background server's slots share one, serve's get one each); default from models.yaml",
                                               rich_help_panel=_M, callback=_context_size)]
GpuLayersOpt = Annotated[str, typer.Option("--gpu-layers", "-ngl", help="layers to offload to the GPU: N, auto (all, on a GPU build) or 0", rich_help_panel=_M)]
FlashAttnOpt = Annotated[Optional[bool], typer.Option("--flash-attn/--no-flash-attn", help="default: llama.cpp decides", rich_help_panel=_M)]
KvTypeOpt = Annotated[str, typer.Option("--kv-type", help="KV cache type: f16, q8_0 or q4_0", rich_help_panel=_M)]
ThreadsOpt = Annotated[Optional[int], typer.Option("--threads", help="CPU threads (default: one per physical core this process may run on)", rich_help_panel=_M)]
BatchOpt = Annotated[int, typer.Option("--batch", help="prompt tokens per decode call", rich_help_panel=_M)]
RpcOpt = Annotated[Optional[str], typer.Option(
    "--rpc", envvar="LOCALRUN_RPC", rich_help_panel=_M,
    help="split the model over llama.cpp RPC workers (`localrun worker` on other machines): HOST:PORT[,HOST:PORT...]")]
TensorSplitOpt = Annotated[Optional[str], typer.Option(
    "--tensor-split", rich_help_panel=_M, help="proportions of the offloaded layers per device, RPC workers first then GPUs, e.g. 3,1 (default: by free memory)")]
LoraOpt = Annotated[Optional[list[str]], typer.Option(
    "--lora", metavar="FILE[:SCALE]", rich_help_panel=_M,
    help="a LoRA adapter (GGUF) loaded with the model, at SCALE (default 1.0); repeat for more (a model already loaded "
         "with other adapters or scales is loaded again)")]
KeepAliveOpt = Annotated[str, typer.Option(
    "--keep-alive", envvar="LOCALRUN_KEEP_ALIVE",
    help="keep the model loaded in the background server this long after the answer: 5m, 1h, -1 (forever); 0 runs in this process, no server")]
SourceOpt = Annotated[str, typer.Option("--source", help="auto (Hub, else mirror), hub or mirror")]


_D = "Decoding"
DraftOpt = Annotated[Optional[str], typer.Option("--draft", help="speculative decoding: lookup (prompt n-grams), a draft MODEL with the same vocabulary, or none (a model's default off)", rich_help_panel=_D)]
DraftMaxOpt = Annotated[Optional[int], typer.Option("--draft-max", help="most tokens drafted per step (adapts below it; default 32 for lookup, 16 for a draft model)", rich_help_panel=_D)]
BeamsOpt = Annotated[int, typer.Option("--beams", help="beam search with N beams (deterministic; 1 = off)", rich_help_panel=_D)]
LengthPenaltyOpt = Annotated[float, typer.Option("--length-penalty", help="beam score = logprob / length**P", rich_help_panel=_D)]


def _generation(
    source: SourceOpt = "auto",
    ctx: CtxOpt = DEFAULT_LOAD.ctx, gpu_layers: GpuLayersOpt = DEFAULT_LOAD.gpu_layers, flash_attn: FlashAttnOpt = DEFAULT_LOAD.flash_attn,
    kv_type: KvTypeOpt = DEFAULT_LOAD.kv_type, threads: ThreadsOpt = DEFAULT_LOAD.threads, batch: BatchOpt = DEFAULT_LOAD.batch,
    rpc: RpcOpt = DEFAULT_LOAD.rpc, tensor_split: TensorSplitOpt = DEFAULT_LOAD.tensor_split, lora: LoraOpt = None,
) -> None:
    """The options run, chat and serve share: where the model comes from, model and hardware (the sampling
    options are added from SamplingOptions, see sampling_parameters). Each but --source is the LoadSpec field of
    its name, with its default (--lora's None: no adapter, LoadSpec's ())."""


def sampling_parameters() -> list[inspect.Parameter]:
    """One option per sampling option (the one list, runtime.options.SAMPLING), each None unless given:
    plain values as they are, TOKEN=VALUE pairs and files as strings and paths (cli_value reads them)."""
    import typing

    from ..runtime.options import SAMPLING

    params = []
    for option in SAMPLING:
        kind = option.type
        if option.pairs:
            kind = list[str]
        elif option.file:
            kind = str if option.name == "json_schema" else Path  # inline JSON stays as written (a Path folds //)
        else:
            args = [a for a in typing.get_args(kind) if a is not type(None)]
            if typing.get_origin(kind) is typing.Union and len(args) == 1:
                kind = args[0]
        flag = typer.Option(option.flag, *option.short, help=option.help or option.description, rich_help_panel="Sampling")
        params.append(inspect.Parameter(option.name, inspect.Parameter.POSITIONAL_OR_KEYWORD, default=None,
                                        annotation=Annotated[Optional[kind], flag]))
    return params


def _decoding(
    draft: DraftOpt = DEFAULT_LOAD.draft, draft_max: DraftMaxOpt = DEFAULT_LOAD.draft_max, beams: BeamsOpt = DEFAULT_LOAD.beams,
    length_penalty: LengthPenaltyOpt = DEFAULT_LOAD.length_penalty,
) -> None:
    """The decoding strategy options run and chat share (LoadSpec's fields, with its defaults)."""


def shared_options(*, decoding: bool = False) -> Callable[[Callable], Callable]:
    """Give a Typer command the shared options (after its own), passed to it as keyword arguments
    (its `**options`). Typer reads a command's parameters from its signature, so one list serves all."""
    templates = [_generation, _decoding] if decoding else [_generation]
    extra = [p for t in templates for p in inspect.signature(t, eval_str=True).parameters.values()]
    extra = extra[:1] + sampling_parameters() + extra[1:]  # after --source, before the model and hardware options

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
