"""Every strategy's communication step against a dense numpy reference, on the world
size this job was started with:

    mpiexec -n N python tests/programs/check_strategies.py

Rank-distinct parameters X (row j = rank j's) go through one step of the real plugin
(constructed as `commbench run` constructs it); rank r must then hold row r of
W @ X, W built independently from commbench.topology. The parameter-averaging
strategies run every case once per CPU transport of their neighbor exchange
(--cpu-transport gloo, then mpi: this job is under mpiexec); so does `allreduce`
(DDP on gloo, then with its MPI averager). Many cases run in one
job, so that CI starts one launcher per world size, not one per case. Rank 0 prints
`FAIL <strategy>: <what>` per mismatch and `RESULT <strategy> <checked> <failed>`
per strategy; the exit code is 1 when anything failed.

The test files import `run_checks(n)`, which starts the job once per world size and
pytest session and parses its output.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import os
import re
import sys
import traceback
from typing import Dict, List, NamedTuple, Optional, Tuple

import numpy as np

STATIC = ["exponential-2", "exponential-3", "symmetric-exponential", "ring", "ring-left",
          "ring-right", "mesh-2d", "star", "fully-connected"]
DYNAMIC = ["exponential-2", "ring", "symmetric-exponential", "fully-connected"]
DYNAMIC_STEPS = 5
# what `auto` moves messages between machines over (messages of a small model may go
# over MPI instead; then the machine sums over its process group)
AUTO_BETWEEN_MACHINES = {"auto": "gloo"}
SHARED_MEMORY = "shared memory"  # commbench.comm.machine_averaging.SHARED_MEMORY

STRATEGIES = ("neighbor_allreduce", "hierarchical_neighbor_allreduce", "gradient_allreduce",
              "allreduce", "local_sgd", "diloco")
FLOAT_TOL = 1e-5
FP16_TOL = 3e-3  # values in [-1, 1): float16 rounds them to 2^-11 relative
# Equal models' distance: the mean the measure takes of n equal float32 values rounds.
CONSENSUS_ROUNDING = 1e-10
BF16_ROUNDING = 2.0 ** -8  # bfloat16 keeps 8 bits of significand
BF16_TOL = 2.0 ** -6  # values in [-1, 1), a few roundings of 2^-9 each
POWERSGD_TOL = 1e-4  # full rank: exact but for float32 orthogonalization


# --- the side that runs under mpiexec ---------------------------------------------


class Checker:
    def __init__(self, ctx):
        self.ctx = ctx
        self.n, self.rank = ctx.world_size, ctx.rank
        self.case = 0  # advances identically on every rank: seeds the values of a case
        self.checked = {s: 0 for s in STRATEGIES}
        self.transport = "gloo"  # --cpu-transport of the strategies built by plugin()
        self.bf16 = False  # whether the backend sums bfloat16 (torch 1.10's gloo cannot)
        self.failures: List[Tuple[str, str]] = []

    # values -------------------------------------------------------------------

    def values(self, rank: int, index: int, shape, dtype) -> np.ndarray:
        """Parameter `index` of worker `rank` in the current case, as the model holds it."""
        import torch

        rng = np.random.default_rng([self.case, rank, index])
        raw = torch.from_numpy(rng.uniform(-1, 1, size=tuple(shape)))
        return raw.to(dtype).double().numpy()

    def set_distinct(self, model) -> List[np.ndarray]:
        """Give every rank its own parameters; return X, one stacked array per parameter."""
        import torch

        self.case += 1
        stacks = []
        for index, p in enumerate(model.parameters()):
            rows = [self.values(j, index, p.shape, p.dtype) for j in range(self.n)]
            with torch.no_grad():
                p.copy_(torch.from_numpy(rows[self.rank]))
            stacks.append(np.stack(rows))
        return stacks

    def compare(self, strategy: str, label: str, model, expected: List[np.ndarray],
                tol: float) -> None:
        self.checked[strategy] += 1
        for index, (p, want) in enumerate(zip(model.parameters(), expected)):
            got = p.detach().double().numpy()
            error = float(np.max(np.abs(got - want))) if want.size else 0.0
            if not error <= tol:
                self.failures.append((strategy, f"[{self.transport}] {label}: rank "
                                      f"{self.rank} parameter {index} off by {error:.3g} "
                                      f"(tolerance {tol:g})"))
                return

    @staticmethod
    @contextlib.contextmanager
    def recording():
        """One step as a measured step records it (what the watched hooks see), its
        spans kept for the check; forgotten after."""
        from commbench.timing import spans

        with spans.Recorder().measured_step() as recorder:
            yield recorder.events

    # plugins ------------------------------------------------------------------

    def plugin(self, name: str, ctx=None, **flags):
        from commbench import registry
        from commbench.config.run_config import RunConfig

        config = RunConfig(dist_optimizer=name, cpu_transport=self.transport, **flags)
        plugin = registry.resolve(name)(ctx or self.ctx, config)
        used = plugin.facts().get("transport", self.transport)
        # auto (between machines: gloo, shared memory inside) or a silent fallback would
        # test one path twice
        if used != AUTO_BETWEEN_MACHINES.get(self.transport, self.transport):
            self.failures.append((name, f"[{self.transport}] transport: rank {self.rank} "
                                  f"uses {used}"))
        return plugin

    def machines(self, machine_size: int):
        return dataclasses.replace(self.ctx, machine_size=machine_size, simulated_machines=True)

    def mixing_case(self, strategy: str, label: str, plugin, weights_per_step, tol: float,
                    reset_each_step: bool = True, model=None) -> None:
        """Run len(weights_per_step) communication steps; compare after each (or after
        the last, when the values are carried on)."""
        import torch

        model = model or two_dtype_model()
        plugin.wrap(model, torch.optim.SGD(model.parameters(), lr=0.0))
        inside, between = (getattr(plugin.mixer, name, None) for name in ("inside", "transport"))
        if self.transport == "auto" and between == "gloo" and inside != SHARED_MEMORY:
            self.failures.append((strategy, f"[auto] {label}: rank {self.rank} sums inside "
                                  f"the machine over {inside}, not {SHARED_MEMORY}"))
        x = self.set_distinct(model)
        for t, w in enumerate(weights_per_step):
            if reset_each_step and t:
                x = self.set_distinct(model)
            plugin.mixer.start()
            plugin.mixer.finish()
            x = [np.tensordot(w, stack, axes=1) for stack in x]  # W @ X per parameter
            if reset_each_step or t == len(weights_per_step) - 1:
                self.compare(strategy, f"{label} step {t}", model, [s[self.rank] for s in x],
                             tol)

    # the cases ----------------------------------------------------------------

    def neighbor_allreduce(self) -> None:
        from commbench.topology import build_schedule, build_topology

        n, s = self.n, "neighbor_allreduce"
        for name in STATIC:
            plugin = self.plugin(s, topology=name, disable_dynamic_topology=True)
            w = build_topology(name, n).weights
            self.mixing_case(s, f"static {name}", plugin, [w, w], FLOAT_TOL)
        for name in DYNAMIC:
            schedule = build_schedule(name, n, True)
            plugin = self.plugin(s, topology=name)
            self.mixing_case(s, f"dynamic {name}", plugin,
                             [schedule.at(t).weights for t in range(DYNAMIC_STEPS)], FLOAT_TOL)
        for local in divisors(n):
            if 1 < local < n:  # several simulated machines: Bluefog's multi-machine schedule
                schedule = build_schedule("exponential-2", n, True, local)
                plugin = self.plugin(s, ctx=self.machines(local))
                if plugin.facts()["schedule"] != schedule.kind:
                    self.failures.append((s, f"machines of {local}: rank {self.rank} schedule "
                                          f"{plugin.facts()['schedule']}, want {schedule.kind}"))
                steps = [schedule.at(t).weights for t in range(schedule.period + 1)]
                self.mixing_case(s, f"dynamic {schedule.kind} machines of {local}", plugin,
                                 steps, FLOAT_TOL)
        w = build_topology("exponential-2", n).weights
        self.mixing_case(s, "fp16 static exponential-2",
                         self.plugin(s, disable_dynamic_topology=True, fp16_allreduce=True),
                         [w], FP16_TOL)
        self.mixing_case(s, "bf16 static exponential-2",
                         self.plugin(s, disable_dynamic_topology=True, compression="bf16"),
                         [w], BF16_TOL)
        schedule = build_schedule("exponential-2", n, True)
        self.mixing_case(s, "fp16 dynamic exponential-2", self.plugin(s, fp16_allreduce=True),
                         [schedule.at(t).weights for t in range(3)], FP16_TOL)
        if n & (n - 1) == 0 and n > 1:  # one-peer exponential-2 averages exactly in log2 n
            steps = n.bit_length() - 1
            self.mixing_case(s, f"exact average after {steps} one-peer steps", self.plugin(s),
                             [np.full((n, n), 1.0 / n)] * steps, FLOAT_TOL,
                             reset_each_step=False)
        for atc in (False, True):
            for dynamic in (False, True):
                w = build_schedule("exponential-2", n, dynamic).at(0).weights
                plugin = self.plugin(s, atc_style=atc, disable_dynamic_topology=not dynamic)
                self.semantics_case(s, plugin, w, atc)

    def hierarchical(self) -> None:
        from commbench.topology import build_schedule, build_topology

        n, s = self.n, "hierarchical_neighbor_allreduce"
        real = self.ctx.num_machines > 1 and not self.ctx.simulated_machines
        for local in [self.ctx.machine_size] if real else divisors(n):
            machines = n // local
            ctx = self.ctx if real else self.machines(local)  # the launcher's machines, or
            #                                                    simulated ones of each size

            def kron(w_machines):  # machines' W, each machine averaged inside
                return np.kron(w_machines, np.full((local, local), 1.0 / local))

            for atc in (False, True):  # AWC communicates from a copy, ATC in place
                w = kron(build_topology("exponential-2", machines).weights)
                plugin = self.plugin(s, ctx=ctx, disable_dynamic_topology=True, atc_style=atc)
                self.mixing_case(s, f"static exponential-2, machines of {local}, "
                                 f"{'atc' if atc else 'awc'}", plugin, [w, w], FLOAT_TOL)
            w = kron(build_topology("ring", machines).weights)
            self.mixing_case(s, f"static ring, machines of {local}",
                             self.plugin(s, ctx=ctx, topology="ring",
                                         disable_dynamic_topology=True), [w], FLOAT_TOL)
            schedule = build_schedule("exponential-2", machines, True)
            self.mixing_case(s, f"dynamic, machines of {local}", self.plugin(s, ctx=ctx),
                             [kron(schedule.at(t).weights) for t in range(4)], FLOAT_TOL)
            for atc in (False, True):
                self.mixing_case(s, f"fp16 dynamic, machines of {local}, "
                                 f"{'atc' if atc else 'awc'}",
                                 self.plugin(s, ctx=ctx, fp16_allreduce=True, atc_style=atc),
                                 [kron(schedule.at(t).weights) for t in range(2)], FP16_TOL)
            if self.bf16:
                self.mixing_case(s, f"bf16 dynamic, machines of {local}",
                                 self.plugin(s, ctx=ctx, compression="bf16"),
                                 [kron(schedule.at(t).weights) for t in range(2)], BF16_TOL)
            for atc in (False, True):
                plugin = self.plugin(s, ctx=ctx, atc_style=atc, disable_dynamic_topology=True)
                self.semantics_case(s, plugin,
                                    kron(build_topology("exponential-2", machines).weights), atc)
            if local == 2 and machines > 1:  # buffers of several pieces, in a pipeline
                for fp16 in (False, True):
                    self.mixing_case(s, f"{'fp16 ' if fp16 else ''}dynamic, pieces of a "
                                     f"pipeline, machines of {local}",
                                     self.plugin(s, ctx=ctx, fp16_allreduce=fp16),
                                     [kron(schedule.at(t).weights) for t in range(2)],
                                     FP16_TOL if fp16 else FLOAT_TOL, model=large_model())

    def semantics_case(self, strategy: str, plugin, w: np.ndarray, atc: bool) -> None:
        """One training step on a linear model against the closed forms (SGD, no momentum):
        AWC x_r' = sum_j W_rj x_j - lr g_r(x_r); ATC x_r' = sum_j W_rj (x_j - lr g_j(x_j))."""
        import torch

        lr = 0.1
        model = linear_model()
        step = plugin.wrap(model, torch.optim.SGD(model.parameters(), lr=lr, momentum=0.0))
        x = self.set_distinct(model)
        grads = [local_gradients([s[j] for s in x], batch(j)) for j in range(self.n)]
        step(*batch(self.rank))
        if atc:
            moved = [np.stack([s[j] - lr * grads[j][i] for j in range(self.n)])
                     for i, s in enumerate(x)]
            want = [np.tensordot(w, m, axes=1)[self.rank] for m in moved]
        else:
            want = [np.tensordot(w, s, axes=1)[self.rank] - lr * grads[self.rank][i]
                    for i, s in enumerate(x)]
        self.compare(strategy, f"{'ATC' if atc else 'AWC'} step", model, want, FLOAT_TOL)

    def gradient_averaging(self, strategy: str, kinds=("none", "fp16", "bf16")) -> None:
        """After one step every gradient is the mean of the workers' and every worker
        moved by -lr times it (all start from rank 0's parameters); in a narrow type,
        within its rounding."""
        import torch

        lr = 0.5
        for kind in kinds:
            if kind == "bf16" and not self.bf16:
                continue
            torch.manual_seed(1)
            model = linear_model()
            start = [p.detach().double().numpy().copy() for p in model.parameters()]
            plugin = self.plugin(strategy, compression=kind)
            step = plugin.wrap(model, torch.optim.SGD(model.parameters(), lr=lr, momentum=0.0))
            grads = [local_gradients(start, batch(j)) for j in range(self.n)]
            mean = [np.mean([g[i] for g in grads], axis=0) for i in range(len(start))]
            with self.recording() as events:
                step(*batch(self.rank))
                pieces = [e for e in events if e.kind == "comm" and e.end is not None]
            if kind != "none" and strategy == "allreduce" and not pieces:
                self.failures.append((strategy, f"{kind}: rank {self.rank} recorded no piece"))
            tol = {"none": FLOAT_TOL, "fp16": FP16_TOL, "bf16": BF16_TOL}[kind]
            label = "" if kind == "none" else f"{kind} "
            late = getattr(getattr(plugin, "averager", None), "late", 0)
            if late:  # averaged all the same, but not overlapped with backward
                self.failures.append((strategy, f"{label}hooks: rank {self.rank} launched "
                                      f"{late} allreduces only after backward"))
            self.checked[strategy] += 1
            for i, p in enumerate(model.parameters()):
                error = float(np.max(np.abs(p.grad.double().numpy() - mean[i])))
                if not error <= tol:
                    self.failures.append((strategy, f"{label}gradient {i}: rank {self.rank} "
                                          f"is off the mean by {error:.3g}"))
            self.compare(strategy, f"{label}step", model,
                         [s - lr * g for s, g in zip(start, mean)], lr * tol + FLOAT_TOL)

    def powersgd(self) -> None:
        """allreduce --compression powersgd (torch's hook, watched), the same batch four
        times at lr 0 (plain allreduce for the first two, torch's start_powerSGD_iter):
        at full rank every gradient is the mean of the workers'; at rank 1 the error
        feedback carries what the approximation missed, so the two compressed steps
        and the error left add up to twice the local gradient: o3 + o4 + e4 = 2 g."""
        import torch

        s = "allreduce"
        # Linear(6, 4): a 4 x 6 weight; at rank 4 it shrinks only below min_rate 0.6.
        for label, spec in (("full rank", "powersgd:4,min_rate=0.5"), ("rank 1", "powersgd:1")):
            torch.manual_seed(1)
            model = linear_model()
            start = [p.detach().double().numpy().copy() for p in model.parameters()]
            plugin = self.plugin(s, compression=spec)
            step = plugin.wrap(model, torch.optim.SGD(model.parameters(), lr=0.0))
            mine = local_gradients(start, batch(self.rank))
            grads = [local_gradients(start, batch(j)) for j in range(self.n)]
            mean = [np.mean([g[i] for g in grads], axis=0) for i in range(len(start))]
            out = []
            for t in range(4):  # recorded as measured steps: the hook is watched
                with self.recording() as events:
                    step(*batch(self.rank))
                    kinds = [e.kind for e in events if e.end is not None]
                out.append([p.grad.double().numpy().copy() for p in model.parameters()])
                if t >= 2 and (kinds.count("comm") < 3 or "codec" not in kinds):
                    self.failures.append((s, f"powersgd {label} step {t + 1}: rank {self.rank} "
                                          f"recorded {kinds.count('comm')} pieces (want the "
                                          "whole tensors', P's and Q's) and codec "
                                          f"{'codec' in kinds}"))
            self.checked[s] += 1
            if label == "full rank":
                for t in (2, 3):
                    self._close(s, f"powersgd {label} step {t + 1}", out[t], mean, POWERSGD_TOL)
                continue
            errors = plugin.powersgd.error_dict
            left = torch.cat([e.flatten() for _, e in sorted(errors.items())]).double().numpy()
            want = np.concatenate([(2 * g - a - b).ravel()
                                   for g, a, b in zip(mine, out[2], out[3])])
            self._close(s, f"powersgd {label} error feedback", [np.sort(left)],
                        [np.sort(want)], POWERSGD_TOL)
            if not np.abs(left).max() > 1e-3:
                self.failures.append((s, f"powersgd {label}: rank {self.rank} kept no error "
                                      "(a rank-1 approximation of a 4 x 6 gradient is lossy)"))

    def _close(self, strategy: str, label: str, got, want, tol: float) -> None:
        for i, (a, b) in enumerate(zip(got, want)):
            error = float(np.max(np.abs(a - b))) if a.size else 0.0
            if a.shape != b.shape or not error <= tol:
                self.failures.append((strategy, f"{label}: rank {self.rank} tensor {i} off "
                                      f"by {error:.3g} (tolerance {tol:g})"))
                return

    def periodic(self, strategy: str, every: int, steps: int, warmup: int = 0,
                 outer_lr: float = 1.0, momentum: float = 0.0, bf16: bool = False,
                 inside: int = 0, local: int = 0) -> None:
        """Local SGD steps from rank-distinct parameters against the dense reference:
        every worker x_j -= lr g_j(x_j); after the steps the schedule names (each of the
        first `warmup`, then every `every`-th) the shared parameters s of the last
        meeting take an outer SGD step with Nesterov momentum on the mean
        pseudo-gradient d = mean_j (s - x_j) (b = m b + d; s -= outer_lr (d + m b)), and
        every x_j = s: with outer_lr 1 and no momentum, the mean of the x_j (local_sgd).
        Right after a meeting the consensus distance is zero; after a local step it is
        not. bf16 pseudo-gradients are off by their rounding at most. With `inside` on
        simulated machines of `local` ranks, the steps that meet every `inside`-th but
        not every `every`-th average the x_j of each machine only."""
        import torch

        from commbench.job.per_iteration import consensus_distance

        lr = 0.2
        model = linear_model()
        options = {"average_every": [inside, every] if inside else every}
        options.update({"local_warmup_steps": warmup} if strategy == "local_sgd" else
                       {"outer_lr": outer_lr, "outer_momentum": momentum,
                        "outer_dtype": "bf16" if bf16 else "fp32"})
        plugin = self.plugin(strategy, ctx=self.machines(local) if inside else None,
                             options=options)
        step = plugin.wrap(model, torch.optim.SGD(model.parameters(), lr=lr, momentum=0.0))
        shared = [p.detach().double().numpy().copy() for p in model.parameters()]
        momenta = [np.zeros_like(s) for s in shared]
        x = self.set_distinct(model)  # after wrap's broadcast: workers that drifted apart
        label = f"H={every} K={warmup} outer lr {outer_lr:g} m {momentum:g}" + \
            " bf16" * bf16 + (f" inside machines of {local} every {inside}" if inside else "")
        tol, biggest = FLOAT_TOL, 0.0
        for t in range(1, steps + 1):
            grads = [local_gradients([s[j] for s in x], batch(j)) for j in range(self.n)]
            x = [np.stack([s[j] - lr * grads[j][i] for j in range(self.n)])
                 for i, s in enumerate(x)]
            meets = t <= warmup or (t - warmup) % every == 0
            if inside and not meets and (t - warmup) % inside == 0:
                x = [np.repeat(s.reshape(-1, local, *s.shape[1:]).mean(axis=1), local, axis=0)
                     for s in x]
            elif meets:
                for i, s in enumerate(x):
                    pseudo = (shared[i] - s).mean(axis=0)
                    biggest = max(biggest, float(np.abs(pseudo).max()))
                    momenta[i] = momentum * momenta[i] + pseudo
                    shared[i] = shared[i] - outer_lr * (pseudo + momentum * momenta[i])
                x = [np.broadcast_to(s, stack.shape).copy() for s, stack in zip(shared, x)]
                if bf16:  # each meeting rounds twice (the share, the sum), carried on
                    tol += 2 * BF16_ROUNDING * biggest * outer_lr * (1 + momentum) / \
                        (1 - momentum)
            step(*batch(self.rank))
            self.compare(strategy, f"{label} step {t}", model, [s[self.rank] for s in x], tol)
            distance = consensus_distance(model, self.n)
            if inside and not meets:  # machines that agree inside differ between them
                continue
            if meets != (distance < CONSENSUS_ROUNDING):
                self.failures.append((strategy, f"{label} step {t}: rank {self.rank} "
                                      f"consensus distance {distance:.3g} after "
                                      f"{'a meeting' if meets else 'a local'} step"))

    def large_bucket(self) -> None:
        """allreduce's MPI averager on a bucket of several chunks (and a ragged end):
        every element is the mean of the workers'."""
        import torch

        from commbench.comm.mpi_averager import CHUNK_BYTES

        count = 2 * CHUNK_BYTES // 4 + 12345
        rows = [self.values(j, 0, (count,), torch.float32) for j in range(self.n)]
        plugin = self.plugin("allreduce")
        bucket = torch.from_numpy(rows[self.rank]).float()
        plugin.average(bucket)
        self.compare("allreduce", "bucket of 3 chunks", torch.nn.ParameterList(
            [torch.nn.Parameter(bucket)]), [np.mean(rows, axis=0)], FLOAT_TOL)


def divisors(n: int) -> List[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def two_dtype_model():
    """Parameters of two dtypes, so that the exchange handles several flat buffers."""
    import torch

    class TwoDtypes(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.linear = torch.nn.Linear(5, 3)
            self.extra = torch.nn.Parameter(torch.zeros(4, 2, dtype=torch.float64))

    return TwoDtypes()


def large_model():
    """Buffers of two dtypes, each cut into several pieces of the hierarchical pipeline,
    the last one ragged."""
    import torch

    from commbench.comm.machine_averaging import PIPELINE_BYTES

    class Large(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.wide = torch.nn.Parameter(torch.zeros(2 * PIPELINE_BYTES["gloo"] // 4 + 12345))
            self.extra = torch.nn.Parameter(torch.zeros(PIPELINE_BYTES["gloo"] // 8 + 7,
                                                        dtype=torch.float64))

    return Large()


def linear_model():
    import torch

    return torch.nn.Linear(6, 4)


def batch(rank: int):
    import torch

    g = torch.Generator().manual_seed(1000 + rank)
    return torch.randn(5, 6, generator=g), torch.randint(4, (5,), generator=g)


def local_gradients(params: List[np.ndarray], data) -> List[np.ndarray]:
    """Gradient of worker j's loss at worker j's parameters, computed on a copy."""
    import torch
    import torch.nn.functional as F

    twin = linear_model()
    with torch.no_grad():
        for p, value in zip(twin.parameters(), params):
            p.copy_(torch.from_numpy(value))
    images, labels = data
    F.cross_entropy(twin(images), labels).backward()
    return [p.grad.double().numpy() for p in twin.parameters()]


def main() -> int:
    import torch.distributed as dist

    from commbench.launch.distributed import init_distributed, leave_libraries
    from commbench.launch.detect import detect_launch

    ctx = init_distributed(detect_launch(), no_cuda=True, timeout=120)
    checker = Checker(ctx)
    from commbench.config.compression import backend_sums_bfloat16

    checker.bf16 = backend_sums_bfloat16("cpu")
    wanted = set(sys.argv[1:]) or set(STRATEGIES)  # the strategies named, else all
    for transport in ("gloo", "mpi"):
        checker.transport = transport
        if "neighbor_allreduce" in wanted:
            checker.neighbor_allreduce()
        if "hierarchical_neighbor_allreduce" in wanted:
            checker.hierarchical()
    if "hierarchical_neighbor_allreduce" in wanted and ctx.num_machines > 1 and \
            not ctx.simulated_machines:  # real machines: auto sums in shared memory
        from commbench.optimizers.hierarchical_neighbor_allreduce import (
            HierarchicalNeighborAllreduce)

        HierarchicalNeighborAllreduce.shared_memory_bytes = 0  # the small models' too
        checker.transport = "auto"
        checker.hierarchical()
    if "gradient_allreduce" in wanted:
        checker.transport = "gloo"
        checker.gradient_averaging("gradient_allreduce")
        from commbench.optimizers.gradient_allreduce import GradientAverager

        GradientAverager.use_post_accumulate_grad_hook = False  # the torch < 2.1 hooks
        checker.gradient_averaging("gradient_allreduce")
    if "allreduce" in wanted:
        checker.transport = "gloo"
        checker.gradient_averaging("allreduce")
        from commbench.launch.gpus import torch_older_than

        if not torch_older_than(2, 0):  # allreduce refuses PowerSGD on torch 1.10
            checker.powersgd()
        checker.transport = "mpi"  # DDP's buckets through the MPI averager (no fp16 on MPI)
        checker.gradient_averaging("allreduce", kinds=("none",))
        checker.large_bucket()
    checker.transport = "gloo"
    if "local_sgd" in wanted:
        checker.periodic("local_sgd", every=1, steps=3)
        checker.periodic("local_sgd", every=3, warmup=2, steps=8)
        for local in divisors(ctx.world_size)[1:-1]:  # several simulated machines
            checker.periodic("local_sgd", every=4, steps=8, warmup=1, inside=2, local=local)
    if "diloco" in wanted:
        checker.periodic("diloco", every=2, steps=4)  # outer lr 1, no momentum: local SGD
        checker.periodic("diloco", every=2, steps=6, outer_lr=0.7, momentum=0.9)
        if checker.bf16:  # torch 1.10's gloo cannot: diloco refuses bf16 there
            checker.periodic("diloco", every=3, steps=6, outer_lr=0.7, momentum=0.9,
                             bf16=True)
    everyone: List = [None] * ctx.world_size
    dist.all_gather_object(everyone, checker.failures)
    failures = [f for rank in everyone for f in rank]
    if ctx.rank == 0:
        for strategy, what in failures:
            print(f"FAIL {strategy}: {what}")
        for strategy in STRATEGIES:
            # Cases, not (rank, case) pairs: a wrong case usually fails on every rank.
            failed = len({what.split(": rank ")[0] for s, what in failures if s == strategy})
            print(f"RESULT {strategy} {checker.checked[strategy]} {failed}")
        sys.stdout.flush()
    leave_libraries()
    return 1 if failures else 0


def _run_under_launcher() -> None:
    try:
        code = main()
    except BaseException:
        traceback.print_exc()
        sys.stderr.flush()
        mpi = sys.modules.get("mpi4py.MPI")
        if mpi is not None and mpi.Is_initialized() and not mpi.Is_finalized():
            mpi.COMM_WORLD.Abort(1)  # peers may be waiting on this rank: end them all
        os._exit(1)
    sys.exit(code)


# --- the side that pytest imports ------------------------------------------------


class Outcome(NamedTuple):
    returncode: int
    output: str  # stdout and stderr, for failure messages
    results: Dict[str, Tuple[int, int]]  # strategy -> (cases checked, cases failed)
    failures: Dict[str, List[str]]


# The job's own limit; a test that starts it needs a longer one than pytest's default.
CHECKS_SECONDS = 420
CHECKS_TIMEOUT = CHECKS_SECONDS + 60


@functools.lru_cache(maxsize=None)
def run_checks(n: int, timeout: float = CHECKS_SECONDS) -> Outcome:
    """Run this program under `mpiexec -n n` once per pytest session."""
    from launchers import mpiexec

    return outcome(mpiexec(n, [os.path.abspath(__file__)], timeout=timeout))


def outcome(proc) -> Outcome:
    """What a finished check job found."""
    results, failures = {}, {s: [] for s in STRATEGIES}
    for line in proc.stdout.splitlines():
        result = re.fullmatch(r"RESULT (\S+) (\d+) (\d+)", line.strip())
        if result:
            results[result[1]] = (int(result[2]), int(result[3]))
        failure = re.match(r"FAIL (\S+): (.*)", line)
        if failure:
            failures.setdefault(failure[1], []).append(failure[2])
    output = f"exit {proc.returncode}\n{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}"
    return Outcome(proc.returncode, output, results, failures)


def assert_strategy_clean(n: int, strategy: str, found: Optional[Outcome] = None) -> None:
    found = found or run_checks(n)
    if strategy not in found.results:
        raise AssertionError(f"the check job on {n} ranks did not finish:\n{found.output}")
    checked, failed = found.results[strategy]
    assert checked > 0, f"no case of {strategy} was checked on {n} ranks"
    assert failed == 0, (f"{failed} of {checked} cases of {strategy} on {n} ranks differ from "
                         f"the dense reference:\n" + "\n".join(found.failures[strategy][:20]))


if __name__ == "__main__":
    _run_under_launcher()
