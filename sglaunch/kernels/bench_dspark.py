"""Time each DSpark kernel against its torch reference at serving-like sizes; prints achieved
bandwidth (bytes the kernel must touch / time). GPU only:  python -m sglaunch.kernels.bench_dspark"""

from __future__ import annotations

import torch

from sglaunch.kernels import dspark_accept, dspark_pack, dspark_topk


def bench(fn, reps: int = 50) -> float:
    """Median milliseconds of fn() over reps (after warm-up), CUDA events."""
    for _ in range(3):
        fn()
    times = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end))
    return sorted(times)[len(times) // 2]


def report(name: str, ms_kernel: float, ms_ref: float, nbytes: int) -> None:
    print(f"{name:28s} triton {ms_kernel * 1e3:8.1f} us ({nbytes / ms_kernel / 1e6:8.2f} GB/s)   "
          f"torch reference {ms_ref * 1e3:8.1f} us")


def main() -> None:
    dev = torch.device("cuda")
    for R, G in ((8, 7), (128, 7), (512, 15)):
        logits, temps = torch.randn(R, G, device=dev), torch.rand(G, device=dev) + 0.5
        surv = dspark_topk.survival_triton(logits, temps)
        active = torch.ones(R, dtype=torch.bool, device=dev)
        report(f"survival R={R} G={G}", bench(lambda: dspark_topk.survival_triton(logits, temps)),
               bench(lambda: dspark_topk.survival_reference(logits, temps)), 8 * R * G)
        report(f"topk R={R} G={G}", bench(lambda: dspark_topk.topk_windows_triton(surv, active, R * G // 2)),
               bench(lambda: dspark_topk.topk_windows_reference(surv, active, R * G // 2)), 4 * R * G + 4 * R)
        anchors, draft = torch.randint(0, 1000, (R,), device=dev), torch.randint(0, 1000, (R, G), device=dev)
        pos, win = torch.randint(0, 4000, (R,), device=dev), torch.randint(0, G + 1, (R,), device=dev)
        T = int(win.sum()) + R
        report(f"pack R={R} G={G}", bench(lambda: dspark_pack.pack_triton(anchors, draft, pos, win, T)),
               bench(lambda: dspark_pack.pack_reference(anchors, draft, pos, win)), 8 * R * (G + 3) + 32 * T)
    for R, G, V in ((8, 7, 151936), (64, 7, 151936)):
        q = torch.softmax(torch.randn(R, G, V, device=dev), -1)
        draft = torch.multinomial(q.view(-1, V), 1).view(R, G)
        target = torch.softmax(torch.randn(R * (G + 1), V, device=dev), -1)
        args = (draft, q, target, torch.arange(R, device=dev) * (G + 1), torch.full((R,), G, device=dev),
                torch.zeros(R, dtype=torch.bool, device=dev), torch.rand(R, G, device=dev), torch.rand(R, device=dev))
        from sglaunch.speculative.accept import accept_draft

        report(f"accept R={R} G={G} V={V}", bench(lambda: dspark_accept.accept_triton(*args), reps=20),
               bench(lambda: accept_draft(*args), reps=20), 4 * V * R * 3)  # ~P_n, q_n read twice + row reads


if __name__ == "__main__":
    main()
