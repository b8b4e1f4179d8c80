"""The lab's commands, ``kvoffload emulate``, ``kvoffload demo``, ``kvoffload cluster`` and ``kvoffload calibrate``,
which the CLI loads only when asked, through the ``kvoffload.commands`` entry points (lab/pyproject.toml).

The operator image ships without the lab; ``kvoffload.cli.main`` then answers these
commands with what to install instead.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from typing import Any

import click

from kvoffload.cli.common import EXIT_BAD_INPUT, EXIT_FAIL, STRUCTURED, dump, output_option, reports_bad_input
from kvoffload_lab.engine.flags import engine_options

REQUIRES: dict[str, tuple[str, ...]] = {
    "emulate": (),
    "demo": ("kmock", "matplotlib", "jsonpatch", "attrs", "cryptography"),
    "cluster": ("kmock", "jsonpatch", "attrs", "cryptography"),
    "calibrate": (),  # PyTorch and Triton: the calibration checks them itself, and says where it runs
}
"""Modules of the lab's dependencies each command needs, beyond the operator's own."""


def missing_modules(command: str) -> list[str]:
    """The modules ``command`` needs that are not installed: checked before it starts anything."""
    return [name for name in REQUIRES.get(command, ()) if importlib.util.find_spec(name) is None]


class LabCommand(click.Command):
    """A lab command that names the modules it needs (``requires``): ``kvoffload`` checks them before it starts
    the command, and names those missing (a lab installed with ``--no-deps`` may lack some)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.requires = REQUIRES[self.name or ""]


@click.command(
    "emulate",
    cls=LabCommand,
    context_settings={"ignore_unknown_options": True, "allow_extra_args": True},
    short_help="An engine that speaks vLLM's /metrics and /v1/completions, for demos and tests.",
)
@engine_options
def emulate(args: tuple[str, ...], port: int, host: str, **options: Any) -> None:
    """Run an emulated vLLM engine: block-level GPU/CPU/disk caches priced by a cost model,
    vLLM 0.32's exact /metrics families, and fault knobs (also `POST /emulator/faults`).

    Accepts a Deployment's `vllm serve MODEL --flag ...` arguments; flags it does not know
    are ignored with a warning. `--speak sglang` exposes SGLang 0.5.23's /metrics families
    instead (with `--enable-metrics`, as SGLang), and `--speak trtllm` TensorRT-LLM's at
    /prometheus/metrics, priced the same; the local cluster translates an SGLang or TensorRT-LLM
    container's command line (and its config file) into these options.
    """
    import logging
    import time

    from kvoffload_lab.engine import flags
    from kvoffload_lab.engine.config import ConfigError
    from kvoffload_lab.engine.server import Emulator, run

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    try:
        config, faults, ignored = flags.build({"args": args, **options}, time.monotonic())
    except ConfigError as exc:
        click.echo(str(exc), err=True)
        sys.exit(EXIT_BAD_INPUT)
    if ignored:
        click.echo(f"warning: ignoring arguments the emulator does not model: {' '.join(ignored)}", err=True)
    logging.getLogger("kvoffload.emulate").info(
        "priced by %s; GPU KV cache %d blocks of %d tokens", config.cost.name, config.gpu_kv_blocks, config.block_size
    )
    run(Emulator(config, faults), host, port)


def _duration_option(_ctx: click.Context, _param: click.Parameter, value: str | None) -> float | None:
    from kvoffload.api.quantity import parse_duration

    if value is None:
        return None
    try:
        seconds = parse_duration(value)
    except ValueError as exc:
        raise click.BadParameter(str(exc)) from None
    if seconds <= 0:
        raise click.BadParameter(f"{value!r} is not a positive duration")
    return seconds


@click.command("demo", cls=LabCommand)
@click.option(
    "--scenario",
    type=click.Choice(["promote", "regression"]),
    default="promote",
    show_default=True,
    help="promote: climb to the top and stay. regression: the newest tier's canary slows down ×4 and is rolled back.",
)
@click.option("--fast", is_flag=True, help="Shrink every duration: each scenario ends in about 2-3 minutes.")
@output_option("table", "json", "yaml")
@click.option(
    "--out",
    "out_dir",
    type=click.Path(file_okay=False, path_type=Path),
    default=Path("demo-out"),
    show_default=True,
    help="Where the report goes (timeline.png, summary.md, report.html, operator.log).",
)
@click.option(
    "--policy",
    "policy_path",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    default=None,
    help="A KVOffloadPolicy to roll out instead of the embedded demo policy (examples/demo-two-tier.yaml).",
)
@click.option(
    "--api",
    type=click.Choice(["real", "emulated"]),
    default="real",
    show_default=True,
    help="real: kube-apiserver and its controllers on this machine (built first if missing, 11-15 min cold). "
    "emulated: the in-process emulated API, quicker to start.",
)
@click.option(
    "--engine",
    # demo.DEMO_ENGINES, spelt out: the CLI loads the demo module only when it runs.
    type=click.Choice(["vllm", "sglang", "trtllm"]),
    default=None,
    help="Run the policy's engines as this engine: sglang renders `sglang.launch_server` with HiCache (CPU sizes "
    "in whole GB per TP rank), trtllm `trtllm-serve` with its host cache (no file tier), each emulated speaking "
    "its own metrics. Default: the policy's spec.engine (vllm).",
)
@click.option(
    "--give-up-after",
    "give_up_after",
    callback=_duration_option,
    default=None,
    metavar="DURATION",
    help="End the run NOT as expected if the scenario has not ended this long after the operator started "
    "(e.g. 5m). Default: twice the climb's planned time plus 90s, shown when it starts.",
)
@reports_bad_input
def demo(
    scenario: str,
    fast: bool,
    output: str,
    out_dir: Path,
    policy_path: Path | None,
    api: str,
    engine: str | None,
    give_up_after: float | None,
) -> None:
    """The whole loop on this machine, no cluster needed: the real Kubernetes control plane (or, with
    --api emulated, an emulated API), a real Prometheus, emulated engines (vLLM, or SGLang with --engine), the
    operator, and a replay of the Mooncake conversation trace.

    Shows the rollout live, writes a report (PNG plot and summary) into --out, and exits 0 when the
    scenario ended as expected, 1 otherwise. With -o json or yaml only the final status and timeline go to
    stdout (the progress view goes to stderr).
    """
    import asyncio

    from kvoffload_lab import demo as demo_mod
    from kvoffload_lab.controlplane import ControlPlaneError

    stream = sys.stderr if output in STRUCTURED else sys.stdout
    progress = demo_mod.Progress(stream)
    try:
        result = asyncio.run(
            demo_mod.run_until_signalled(
                demo_mod.SCENARIOS[scenario],
                fast=fast,
                out_dir=out_dir,
                policy_path=policy_path,
                progress=progress,
                api=api,
                engine=engine,
                deadline=give_up_after,
            )
        )
    except (demo_mod.DemoError, ControlPlaneError) as exc:
        click.echo(f"kvoffload demo: {exc}", err=True)
        sys.exit(EXIT_FAIL)
    except (KeyboardInterrupt, asyncio.CancelledError):
        progress.close()
        click.echo("kvoffload demo: interrupted; every process it started has been stopped", err=True)
        sys.exit(130)
    if output in STRUCTURED:
        click.echo(dump(result.to_json(), output))
    else:
        click.echo(demo_mod.final_summary(result))
    sys.exit(0 if result.ok else EXIT_FAIL)


@click.command("cluster", cls=LabCommand)
@click.option(
    "--kubeconfig",
    "kubeconfig",
    type=click.Path(dir_okay=False, path_type=Path),
    required=True,
    help="Write the admin kubeconfig here once the API server answers (removed again on exit).",
)
@click.option(
    "--prometheus-port",
    type=click.IntRange(0, 65535),
    default=0,
    show_default=True,
    help="Prometheus's port on 127.0.0.1; 0: a free one.",
)
@click.option(
    "--webhook-port",
    type=click.IntRange(0, 65535),
    default=0,
    show_default=True,
    help="Register the operator's admission webhook at https://127.0.0.1:PORT (0: a free port); "
    "the `kvoffload run` line printed at start serves it.",
)
@click.option(
    "--workdir",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help="Keep etcd's data, the certificates and every log here (default: a temporary folder, removed on exit).",
)
@click.option(
    "--engine-arg",
    "engine_args",
    multiple=True,
    help="An extra `kvoffload emulate` argument for every engine, e.g. --engine-arg=--gpu-kv-blocks=64.",
)
def cluster(
    kubeconfig: Path, prometheus_port: int, webhook_port: int, workdir: Path | None, engine_args: tuple[str, ...]
) -> None:
    """A local Kubernetes cluster on 127.0.0.1, in the foreground until SIGTERM or Ctrl-C.

    The real control plane (etcd, kube-apiserver with TLS, Node,RBAC authorization and the default
    admission plugins, kube-controller-manager, kube-scheduler), built from the pinned Go modules
    first when the binaries are missing; the KVOffloadPolicy and PodMonitor CRDs; one fake Node per
    GPU class the applied policies name, shaped by the catalog (host memory, GPUs, labels, taints);
    a kubelet stand-in that runs every pod bound to those Nodes as a `kvoffload emulate` engine and
    reports its status; a real Prometheus that scrapes the engines with the PodMonitor's labels; and
    the operator's validating webhook registered on loopback, with a certificate from the cluster's CA.

    Point kubectl and `kvoffload run` at --kubeconfig. Stopping leaves nothing running.
    """
    import asyncio

    from kvoffload_lab.cluster.kubecluster import serve_until_signalled
    from kvoffload_lab.controlplane import ControlPlaneError
    from kvoffload_lab.promserver import PrometheusError

    def progress(line: str) -> None:
        click.echo(f"kvoffload cluster: {line}", err=True)

    try:
        asyncio.run(
            serve_until_signalled(
                kubeconfig,
                workdir=workdir,
                prometheus_port=prometheus_port or None,
                webhook_port=webhook_port or None,
                engine_args=engine_args,
                progress=progress,
            )
        )
    except (ControlPlaneError, PrometheusError) as exc:
        click.echo(f"kvoffload cluster: {exc}", err=True)
        sys.exit(EXIT_FAIL)
    except (KeyboardInterrupt, asyncio.CancelledError):
        click.echo("kvoffload cluster: interrupted; every process it started has been stopped", err=True)
        sys.exit(130)


@click.command(
    "calibrate",
    cls=LabCommand,
    context_settings={"ignore_unknown_options": True, "allow_extra_args": True, "help_option_names": []},
    short_help="Measure a GPU's offload costs into a profile (needs a GPU and PyTorch).",
)
@click.argument("args", nargs=-1, type=click.UNPROCESSED)
def calibrate(args: tuple[str, ...]) -> None:
    """Measure this GPU's pinned transfers, pinning rate, prefill and decode into a cost profile.

    Runs `python -m kvoffload_lab.calibrate ARGS` (see `kvoffload calibrate --help`). With
    --engine-url, measures a running engine's time to first token instead (`kvoffload calibrate
    --engine-url URL --help`).
    """
    if any(a == "--engine-url" or a.startswith("--engine-url=") for a in args):
        from kvoffload_lab.engine_calibrate import engine_calibrate

        engine_calibrate.main(list(args), prog_name="kvoffload calibrate")
        return
    from kvoffload_lab import calibrate as calibration

    sys.exit(calibration.main(list(args)))
