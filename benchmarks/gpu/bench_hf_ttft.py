"""TTFT of the transformers runtime on a full-size hybrid model: full prefill vs a hit from
each tier, and a suffix-replay hit (the GPU proof of issue 28).

A random-weight model of a preset's real geometry (Qwen3.5-0.8B; ``--preset``), bf16. For
each prompt length L (8K and 32K) the prompts share a prefix of P = L - S tokens (S =
``--suffix``). For each tier (device HBM, pinned host memory, NVMe), alone in a
``TieredStore`` of the project's own tiers, request A (P + a) saves the KV chunks, request B
(P + b) saves the checkpoint at the branch point P, and the hits (P + c) are timed:

* ``sync``: ``HFRuntime.prefill`` as shipped (read every object, restore, run the suffix);
* ``layerwise``: the same plan loaded by the copy engine's streams with ``hybrid_connector/kernels/`` moving
  the bytes, overlapped layer by layer with the suffix's prefill (``hf_layerwise``).

Each tier also gets the load alone, the suffix's compute alone, ``hidden = (compute + load -
overlapped) / load`` (the share of the load hidden under compute), and the kernels' moves
alone against a device-to-device ``copy_`` of the same bytes measured in the same run. The
restored KV and states (both paths) and the hit's logits are compared on the device with a
full prefill's. The replay case: a replay-enabled runtime over the host tier, a hit at P that
only anchors can serve (labelled approximate), its TTFT and logits against the full prefill.

Every case appends to the JSON (``--out``) as it finishes, so a run cut short by its timeout
still leaves what it measured; ``--budget-s`` skips the cases that would start after it.

    python3 benchmarks/gpu/bench_hf_ttft.py --out /tmp/hc_gpu/hf_ttft.json
    python benchmarks/gpu/bench_hf_ttft.py --cpu-dry-run --out /tmp/x.json   (tiny, CPU)
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from hf_bench_util import (  # noqa: E402
    copy_bandwidth,
    drop_page_cache,
    failures,
    fs_type,
    prefill_ttft,
    profile_posts,
    rel_err,
    report,
    timed,
)
from hf_layerwise import LayerwiseLoader  # noqa: E402
from hf_models import build_model  # noqa: E402

from hybrid_connector.core.config import load_config  # noqa: E402
from hybrid_connector.core.keys import ObjectKind  # noqa: E402
from hybrid_connector.integrations.hf.runtime import HFRuntime, geometry_for  # noqa: E402
from hybrid_connector.integrations.hf.state import model_forward, new_model_cache  # noqa: E402
from hybrid_connector.payload.layout import kv_layout, state_layout  # noqa: E402
from hybrid_connector.runtime.suffix_replay import ReplayGate, ReplayQuality  # noqa: E402
from hybrid_connector.tiers.copy_engine import CopyEngine  # noqa: E402
from hybrid_connector.tiers.device import DeviceTier  # noqa: E402
from hybrid_connector.tiers.host import HostTier  # noqa: E402
from hybrid_connector.tiers.manager import TieredStore  # noqa: E402
from hybrid_connector.tiers.nvme import NvmeTier  # noqa: E402


class Bench:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.dev = torch.device(args.device)
        self.model = build_model(args.preset, self.dev, torch.bfloat16)
        self.vocab = self.model.config.vocab_size
        self.t_start = time.perf_counter()
        self.out: dict[str, Any] = {
            "device": torch.cuda.get_device_name(self.dev) if self.dev.type == "cuda" else "cpu",
            "preset": args.preset, "dtype": "bfloat16", "suffix": args.suffix,
            "chunk_size": args.chunk_size, "cases": [], "skipped": [], "errors": [],
        }
        self.gen = torch.Generator().manual_seed(0)
        self.tmp = Path(tempfile.mkdtemp(prefix="hc_nvme_", dir=args.nvme_dir))
        self.out["nvme_dir"], self.out["nvme_fs"] = str(self.tmp), fs_type(self.tmp)

    # ---------------------------------------------------------------- helpers
    def tokens(self, n: int) -> list[int]:
        return torch.randint(0, self.vocab, (n,), generator=self.gen).tolist()

    def save(self) -> None:
        self.out["elapsed_s"] = round(time.perf_counter() - self.t_start, 2)
        Path(self.args.out).parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(self.args.out + ".tmp")
        tmp.write_text(json.dumps(self.out, indent=1))
        tmp.replace(self.args.out)

    def over_budget(self, what: str) -> bool:
        if time.perf_counter() - self.t_start > self.args.budget_s:
            self.out["skipped"].append(f"{what}: time budget of {self.args.budget_s} s spent")
            self.save()
            return True
        return False

    def config(self, **over: Any) -> Any:
        return load_config(overrides={"chunk_size": self.args.chunk_size, **over}, environ={})

    def store(self, tier: str, length: int) -> TieredStore:
        # Room for everything the case stores (the prefix, every request's suffix, a dozen
        # checkpoints, the replay case's anchors) with a 2x margin: no eviction mid-case.
        g = geometry_for(self.model)
        kv = kv_layout(g, 2 * length + 8 * self.args.suffix).nbytes
        budgets = {ObjectKind.KV: kv, ObjectKind.STATE: state_layout(g).nbytes * 12,
                   ObjectKind.ANCHOR: kv // 4}
        if tier == "device":
            tiers: list[Any] = [DeviceTier(budgets, device=self.dev)]
        elif tier == "host":
            tiers = [HostTier(budgets)]
        else:
            tiers = [NvmeTier(self.tmp / f"L{length}", budgets, fsync=False)]
        return TieredStore(tiers, load_device=self.dev, copy_device=self.dev)

    @torch.no_grad()
    def reference(self, prefix: list[int], prompt: list[int]) -> dict[str, Any]:
        """Full prefill of ``prompt`` (timed; its last logits) and the cache after the
        prefix alone (the state and KV a hit at len(prefix) must restore)."""
        m, dev = self.model, self.dev
        times = []
        logits = None
        for _ in range(self.args.full_reps):
            mc = new_model_cache(m)
            t, out = timed(dev, lambda mc=mc: model_forward(
                m, torch.tensor([prompt], device=dev), mc,
                torch.arange(len(prompt), device=dev)[None], logits_to_keep=1))
            times.append(t)
            logits = out.logits[0, -1].float()
            del mc, out
        mc = new_model_cache(m)
        p = len(prefix)
        model_forward(m, torch.tensor([prefix], device=dev), mc, torch.arange(p, device=dev)[None],
                      logits_to_keep=1)
        return {"ttft": statistics.median(times), "logits": logits, "cache": mc}

    def compare(self, rt: HFRuntime, mc: Any, ref: Any, p: int) -> dict[str, float]:
        ad = rt.adapter
        out = {"state_rel_err": rel_err(ad.extract_state(mc), ad.extract_state(ref))}
        if ad.attention:
            out["kv_rel_err"] = rel_err(ad.extract_kv(mc, 0, p), ad.extract_kv(ref, 0, p))
        return out

    @staticmethod
    def logits_check(got: torch.Tensor, want: torch.Tensor) -> dict[str, Any]:
        return {"logits_rel_err": rel_err(got, want),
                "top1_equal": bool(int(got.argmax()) == int(want.argmax()))}

    # ---------------------------------------------------------------- a tier
    def run_tier(self, tier: str, prefix: list[int], c_prompt: list[int], ref: dict[str, Any]
                 ) -> dict[str, Any]:
        """One tier alone: requests A and B store the prefix's KV chunks and the checkpoint
        at P; then the layer-wise hits (which save nothing) and the runtime's own hits."""
        store = self.store(tier, len(c_prompt))
        rt = HFRuntime.create(self.model, self.config(), store, anchors=False)
        res: dict[str, Any] = {"tier": tier}
        try:
            for i in range(2):  # A, then B (the branch point P gets its checkpoint)
                t, r = prefill_ttft(rt, prefix + self.tokens(self.args.suffix), self.dev)
                res["miss_ttft_s" if i == 0 else "branch_ttft_s"] = t
                rt.finish(r)
            rt.cache.flush()
            if tier == "nvme":
                res["page_cache_dropped"] = drop_page_cache(self.tmp)
            res.update(self._layerwise(tier, rt, store, len(prefix), c_prompt, ref))
            res.update(self._sync(tier, rt, prefix, c_prompt, ref))
            res["ratio_sync"] = ref["ttft"] / res["sync_ttft_s"]
            res["ratio_layerwise"] = ref["ttft"] / res["layerwise_ttft_s"]
        finally:
            rt.close()
            rt.cache.close()  # and its store
        return res

    def _cold(self, tier: str) -> None:
        if tier == "nvme":
            drop_page_cache(self.tmp)

    def _layerwise(self, tier: str, rt: HFRuntime, store: TieredStore, p: int,
                   c_prompt: list[int], ref: dict[str, Any]) -> dict[str, Any]:
        dev = self.dev
        ids = torch.as_tensor(c_prompt, dtype=torch.long)
        with CopyEngine(max_workers=2, device=dev) as engine:
            lw = LayerwiseLoader(rt, store, engine, file_tier=tier == "nvme")

            def load_all() -> Any:
                hit = lw.start(c_prompt, expect=p)
                hit.wait_all()
                return hit
            # untimed first load: staging buffers; the restored cache against the reference
            self._cold(tier)
            hit = load_all()
            check = self.compare(rt, hit.mc, ref["cache"], p)
            hit.release()
            # the load alone, the suffix's compute alone, the kernels' moves alone
            self._cold(tier)
            t_load, hit = timed(dev, load_all)
            t_comp, _ = timed(dev, lambda: rt._run(ids[p:], hit.mc, p))
            load_bytes = sum(t.numel() * t.element_size() for t in hit.staged.device.values())
            t_k = min(timed(dev, lambda: lw.posts_only(hit))[0] for _ in range(3))
            if self.args.profile_posts:
                profile_posts(dev, lambda: lw.posts_only(hit), self.args.profile_posts)
                hit.release()
                self._cold(tier)
                box: list[Any] = []
                profile_posts(dev, lambda: box.append(load_all()), self.args.profile_posts, "load")
                hit = box[0]
            copy_bw = copy_bandwidth(dev, load_bytes)
            hit.release()
            # overlapped: the suffix's prefill while the hit loads
            lw_t = []
            for i in range(self.args.hit_reps):
                self._cold(tier)
                box: list[Any] = []

                def go(box: list[Any] = box) -> torch.Tensor:
                    box.append(lw.start(c_prompt, expect=p))
                    return lw.run_suffix(box[0], c_prompt)
                t, logits = timed(dev, go)
                box[0].release()
                lw_t.append(t)
                if i == 0:
                    check.update(self.logits_check(logits, ref["logits"]))
        overlapped = statistics.median(lw_t)
        return {
            "layerwise_check": check, "layerwise_ttft_s": overlapped, "load_s": t_load,
            "compute_s": t_comp, "load_bytes": load_bytes, "load_GBps": load_bytes / t_load / 1e9,
            "hidden_share": max(0.0, min(1.0, (t_comp + t_load - overlapped) / t_load)),
            "kernel_GBps": 2 * load_bytes / t_k / 1e9, "copy_GBps": copy_bw / 1e9,
            "kernel_vs_copy": 2 * load_bytes / t_k / copy_bw,
        }

    def _sync(self, tier: str, rt: HFRuntime, prefix: list[int], c_prompt: list[int],
              ref: dict[str, Any]) -> dict[str, Any]:
        """``HFRuntime.prefill`` hits; the first one's restore is captured and compared."""
        p = len(prefix)
        captured: list[dict[str, float]] = []
        orig = rt._restore

        def capture(plan: Any, loaded: Any, info: Any) -> Any:
            mc = orig(plan, loaded, info)
            if not captured:
                captured.append(self.compare(rt, mc, ref["cache"], p))
            return mc
        rt._restore = capture  # type: ignore[method-assign]
        times = []
        check: dict[str, Any] = {}
        try:
            for i in range(self.args.hit_reps):
                self._cold(tier)
                prompt = c_prompt if i == 0 else prefix + self.tokens(self.args.suffix)
                t, r = prefill_ttft(rt, prompt, self.dev)
                if r.info.hit_tokens != p or not r.info.exact:
                    raise RuntimeError(f"sync hit: {r.info.hit_tokens} tokens, exact {r.info.exact}")
                if i == 0:
                    check = {**captured[0], **self.logits_check(r.logits, ref["logits"])}
                times.append(t)
        finally:
            rt._restore = orig  # type: ignore[method-assign]
        return {"sync_check": check, "sync_ttft_s": statistics.median(times)}

    # ---------------------------------------------------------------- replay
    def run_replay(self, prefix: list[int], c_prompt: list[int], ref: dict[str, Any]) -> dict[str, Any]:
        gate = ReplayGate(max_kl=1.0, min_top1=0.0)
        gate.record(ReplayQuality(k=1, kl_mean=0.0, kl_max=0.0, top1=1.0, continuation=1.0,
                                  continuation_len=32))
        conf = self.config(replay=True, anchor_page_size=self.args.anchor_page,
                           anchor_density=0.25)
        store = self.store("host", len(c_prompt))
        rt = HFRuntime.create(self.model, conf, store, gate=gate)
        try:
            rt.finish(rt.prefill(prefix + self.tokens(self.args.suffix)))  # KV + anchors, no state at P
            t, r = prefill_ttft(rt, c_prompt, self.dev)
            info = r.info
            if info.hit_tokens != len(prefix) or not info.replayed:
                raise RuntimeError(f"replay hit: {info.hit_tokens} tokens, replayed {info.replayed}")
            return {"tier": "host", "replay_ttft_s": t, "ratio": ref["ttft"] / t,
                    "replayed_anchors": info.replay_anchors, "exact": info.exact,
                    **self.logits_check(r.logits, ref["logits"])}
        finally:
            rt.close()
            rt.cache.close()  # and its store

    # ---------------------------------------------------------------- main
    def run(self) -> dict[str, Any]:
        try:
            return self._run_all()
        finally:
            shutil.rmtree(self.tmp, ignore_errors=True)

    def _run_all(self) -> dict[str, Any]:
        a = self.args
        for preset in a.check_presets:  # the real geometry's config, without its weights
            try:
                m = build_model(preset, torch.device("meta"), torch.bfloat16)
                self.out.setdefault("preset_checks", {})[preset] = (
                    f"{sum(x.numel() for x in m.parameters()) / 1e9:.2f}B parameters, geometry OK")
            except Exception as exc:  # noqa: BLE001 - recorded as a failure
                self.out["errors"].append(f"preset {preset}: {exc!r}")
        warm = self.tokens(64)
        self.reference(warm[:32], warm)  # kernels, allocator, autotuning
        for length in a.lengths:
            p = length - a.suffix
            prefix = self.tokens(p)
            if self.over_budget(f"L={length}"):
                break
            c_prompt = prefix + self.tokens(a.suffix)
            ref = self.reference(prefix, c_prompt)
            case: dict[str, Any] = {"prompt_tokens": length, "prefix_tokens": p,
                                    "full_ttft_s": ref["ttft"], "tiers": {}}
            self.out["cases"].append(case)
            for tier in [*a.tiers, "replay"]:
                if self.over_budget(f"L={length} {tier}"):
                    break
                try:
                    if tier == "replay":
                        case["replay"] = self.run_replay(prefix, c_prompt, ref)
                    else:
                        case["tiers"][tier] = self.run_tier(tier, prefix, c_prompt, ref)
                except Exception as exc:  # noqa: BLE001 - recorded; the other cases still run
                    self.out["errors"].append(f"L={length} {tier}: {exc!r}")
                self.save()
            del ref
        self.out["failures"] = failures(self.out)
        self.save()
        return self.out


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--preset", default="qwen3.5-0.8b")
    ap.add_argument("--lengths", type=int, nargs="+", default=[8192, 32768])
    ap.add_argument("--suffix", type=int, default=1024)
    ap.add_argument("--chunk-size", type=int, default=1024)
    ap.add_argument("--anchor-page", type=int, default=64)
    ap.add_argument("--tiers", nargs="+", default=["device", "host", "nvme"])
    ap.add_argument("--hit-reps", type=int, default=3)
    ap.add_argument("--full-reps", type=int, default=2)
    ap.add_argument("--budget-s", type=float, default=240.0)
    ap.add_argument("--nvme-dir", default=None, help="where the NVMe tier's files go (default $TMPDIR)")
    ap.add_argument("--out", default=os.path.join(os.environ.get("OUT", "/tmp/hc_gpu"), "hf_ttft.json"))
    ap.add_argument("--profile-posts", type=int, default=0, metavar="N",
                    help="print the N costliest host functions and device kernels of the kernels' moves")
    ap.add_argument("--check-presets", nargs="*", default=[],
                    help="also build these presets on the meta device and check their geometry")
    ap.add_argument("--cpu-dry-run", action="store_true",
                    help="tiny model, tiny prompts, CPU; the real presets checked on meta")
    args = ap.parse_args(argv)
    if args.cpu_dry_run:
        args.device, args.preset, args.lengths, args.suffix = "cpu", "tiny", [96], 32
        args.chunk_size, args.anchor_page, args.hit_reps, args.full_reps = 16, 16, 2, 1
        args.check_presets = args.check_presets or ["qwen3.5-0.8b", "qwen3.5-4b"]
    for length in args.lengths:  # the hit at P needs a KV chunk and an anchor page ending at P
        p = length - args.suffix
        if p <= 0 or p % args.chunk_size or p % args.anchor_page:
            ap.error(f"prefix {p} of length {length} must be a positive multiple of --chunk-size "
                     f"({args.chunk_size}) and --anchor-page ({args.anchor_page})")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    if args.device == "cpu":
        torch.set_num_threads(1)
    out = Bench(args).run()
    report(out)
    print(f"wrote {args.out}")
    return 1 if out["failures"] else 0


if __name__ == "__main__":
    sys.exit(main())
