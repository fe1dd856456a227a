"""The engine's fast linear algebra against torch's: the inverse-Hessian factor (`lapack`), oneDNN's
products (`matmul`), and glibc's allocator settings (`heap`)."""

from __future__ import annotations

import platform

import numpy as np
import pytest

from weightsmith.engine import heap, lapack, matmul

torch = pytest.importorskip("torch")


def _hessian(cols: int, tokens: int, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(tokens, cols, generator=g) @ (torch.randn(cols, cols, generator=g) / cols**0.5 + torch.eye(cols))
    h = 2 * x.t() @ x / tokens
    h.diagonal().add_(0.01 * h.diagonal().mean())
    return h


@pytest.mark.parametrize("cols", [1, 7, 130, 384])
def test_inverse_factor_is_llm_compressors_three_calls_to_float32_rounding(cols: int) -> None:
    h = _hessian(cols, 4 * cols + 8)
    theirs = torch.linalg.cholesky(torch.cholesky_inverse(torch.linalg.cholesky(h)), upper=True)
    kept = h.clone()
    ours = lapack.inverse_factor(h.numpy())
    assert ours is not None and ours.dtype == np.float32 and ours.flags.c_contiguous
    assert torch.equal(h, kept)  # the Hessian is left as it was
    assert np.array_equal(ours, np.triu(ours))
    assert float(np.abs(ours - theirs.numpy()).max() / theirs.abs().max()) < 1e-5
    inverse = torch.linalg.inv(h.double()).numpy()  # and it is the factor of H^-1
    product = ours.astype(np.float64).T @ ours.astype(np.float64)
    assert float(np.abs(product - inverse).max() / np.abs(inverse).max()) < 1e-4


def test_inverse_factor_refuses_what_is_not_positive_definite() -> None:
    assert lapack.inverse_factor(-np.eye(4, dtype=np.float32)) is None
    singular = np.ones((3, 3), np.float32)  # rank one
    assert lapack.inverse_factor(singular) is None
    h = _hessian(16, 64).numpy()
    h[3, 5] = h[5, 3] = np.nan
    assert lapack.inverse_factor(h) is None
    assert lapack.inverse_factor(np.zeros((0, 0), np.float32)).shape == (0, 0)


def test_a_factorization_runs_beside_another_thread() -> None:
    """The LAPACK calls release the GIL: a thread spinning in Python keeps running meanwhile."""
    import threading
    import time

    h = _hessian(1024, 2048).numpy()
    lapack.inverse_factor(h)  # load the routines first
    done, ticks = threading.Event(), []

    def spin() -> None:
        while not done.is_set():
            ticks.append(time.perf_counter())

    thread = threading.Thread(target=spin)
    with lapack.one_blas_thread():
        thread.start()
        started = time.perf_counter()
        for _ in range(3):
            lapack.inverse_factor(h)
        ended = time.perf_counter()
        done.set()
        thread.join()
    during = [t for t in ticks if started < t < ended]
    gaps = np.diff(during)
    assert len(during) > 100 and float(gaps.max()) < 0.5 * (ended - started)


def test_one_blas_thread_limits_and_restores() -> None:
    from threadpoolctl import threadpool_info

    lapack._routines()
    before = {i["filepath"]: i["num_threads"] for i in threadpool_info() if i["user_api"] == "blas"}
    with lapack.one_blas_thread():
        during = {i["filepath"]: i["num_threads"] for i in threadpool_info() if i["user_api"] == "blas"}
    after = {i["filepath"]: i["num_threads"] for i in threadpool_info() if i["user_api"] == "blas"}
    assert during and set(during.values()) == {1}
    assert after == before


@pytest.mark.parametrize("shape", [(5, 3, 64), (2048, 576)])
@pytest.mark.parametrize("bias", [False, True])
def test_linear_is_torchs_to_float32_rounding(shape: tuple[int, ...], bias: bool) -> None:
    g = torch.Generator().manual_seed(1)
    x, w = torch.randn(*shape, generator=g), torch.randn(96, shape[-1], generator=g)
    b = torch.randn(96, generator=g) if bias else None
    ours = matmul.linear(x, w, b)
    assert ours.shape == (*shape[:-1], 96)
    assert torch.allclose(ours, torch.nn.functional.linear(x, w, b), rtol=1e-4, atol=1e-4)



def test_linear_takes_transposed_views_as_gptqs_block_products_pass_them() -> None:
    g = torch.Generator().manual_seed(3)
    block_row, errors = torch.randn(128, 300, generator=g), torch.randn(128, 96, generator=g)  # [k, n], [k, rows]
    assert torch.allclose(matmul.linear(block_row.t(), errors.t()), block_row.t() @ errors, rtol=1e-4, atol=1e-4)


def test_oneDNN_is_probed_and_torch_is_the_fallback(monkeypatch) -> None:
    assert matmul._onednn() is not None  # torch 2.13's CPU build has it: the fast path is the one tested
    monkeypatch.setattr(matmul, "_onednn", lambda: None)
    x, w = torch.randn(4, 8), torch.randn(3, 8)
    assert torch.equal(matmul.linear(x, w), torch.nn.functional.linear(x, w))
    layer = torch.nn.Sequential(torch.nn.Linear(8, 3))
    with matmul.onednn_linears(layer):
        assert "forward" not in vars(layer[0])


@pytest.mark.parametrize("cols", [5, 576, 1536])
def test_gram_is_the_symmetric_product(cols: int) -> None:
    rows = torch.randn(700, cols, generator=torch.Generator().manual_seed(2))
    ours = matmul.gram(rows)
    assert torch.equal(ours, ours.t())
    theirs = rows.double().t() @ rows.double()
    assert float((ours.double() - theirs).abs().max() / theirs.abs().max()) < 1e-5


def test_onednn_linears_replace_forward_only_for_the_duration() -> None:
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))
    x = torch.randn(3, 8)
    seen = []
    model[2].register_forward_pre_hook(lambda module, args: seen.append(args[0].shape))
    with torch.no_grad():
        expected = model(x)
        with matmul.onednn_linears(model):
            assert all("forward" in vars(m) for m in (model[0], model[2]))
            found = model(x)
    assert all("forward" not in vars(m) for m in (model[0], model[2]))
    assert torch.allclose(found, expected, rtol=1e-5, atol=1e-5)
    assert len(seen) == 2  # the hooks ran through the replaced forward too


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="mallopt is glibc's")
def test_glibc_takes_every_allocator_setting() -> None:
    assert heap.keep_freed_memory()
