"""The KV cache's pool of batch entries: joins take free entries, leaves free theirs, and every
read returns exactly what a cache holding only the live rows, in the caller's order, would."""

import torch

from trtllm_dflash.reference.cache import KVCache

L, H, S, D = 2, 3, 10, 4


def _filled(batch: int, g: torch.Generator) -> KVCache:
    c = KVCache(L, batch, H, S, D, torch.float32)
    c.k.copy_(torch.randn(c.k.shape, generator=g))
    c.v.copy_(torch.randn(c.v.shape, generator=g))
    return c


def test_joins_and_leaves_in_any_order_read_like_a_compact_cache():
    g = torch.Generator().manual_seed(0)
    cache = _filled(3, g)
    live = [(cache.k[:, b].clone(), cache.v[:, b].clone()) for b in range(3)]  # [L, H, S+1, D] per live row
    for step in range(40):
        if live and (step % 3 == 0 or len(live) > 6):
            keep = sorted(torch.randperm(len(live), generator=g)[: max(1, len(live) - 2)].tolist(),
                          key=lambda _: float(torch.rand((), generator=g)))  # a subset, shuffled
            cache.keep_rows(torch.tensor(keep))
            live = [live[i] for i in keep]
        else:
            new = _filled(int(torch.randint(1, 3, (), generator=g)), g)
            cache.extend(new)
            live += [(new.k[:, b].clone(), new.v[:, b].clone()) for b in range(new.batch)]
        # a write lands on the caller's rows
        pos = torch.randint(0, S + 1, (len(live), 2), generator=g)
        kw, vw = torch.randn(len(live), 2, H, D, generator=g), torch.randn(len(live), 2, H, D, generator=g)
        layer = step % L
        cache.write(layer, pos, kw, vw)
        for b, (k, v) in enumerate(live):
            k[layer, :, pos[b]], v[layer, :, pos[b]] = kw[b].transpose(0, 1), vw[b].transpose(0, 1)
        assert cache.batch == len(live)
        for layer in range(L):
            keys, values = cache.view(layer, S)
            assert torch.equal(keys, torch.stack([k[layer, :, :S] for k, _ in live]))
            assert torch.equal(values, torch.stack([v[layer, :, :S] for _, v in live]))
    # the pool only grew when every entry was taken: never past twice the most rows ever live
    assert cache.k.shape[1] <= 2 * 8


def test_a_leave_copies_nothing_and_a_join_reuses_the_entry():
    g = torch.Generator().manual_seed(1)
    cache = _filled(4, g)
    storage = cache.k.data_ptr()
    cache.keep_rows(torch.tensor([3, 0]))
    assert cache.k.data_ptr() == storage and cache.rows.tolist() == [3, 0]
    new = _filled(2, g)
    cache.extend(new)
    assert cache.k.data_ptr() == storage and cache.k.shape[1] == 4  # entries 1 and 2 were free
    assert torch.equal(cache.view(0, S)[0][2:], new.k[0, :, :, :S])


def test_ddtree_moves_touch_only_their_row():
    g = torch.Generator().manual_seed(2)
    cache = _filled(3, g)
    cache.keep_rows(torch.tensor([2, 1]))
    before = cache.view(1, S + 1)[0].clone()
    cache.move(0, torch.tensor([5, 6]), torch.tensor([1, 2]))
    after = cache.view(1, S + 1)[0]
    assert torch.equal(after[1], before[1])
    assert torch.equal(after[0, :, 1:3], before[0, :, 5:7])


def test_a_packed_write_lands_where_the_padded_one_does():
    """write(rows=...) of only the real entries ([1, N]) fills the slots a padded [B, T] write
    fills (padding to the trash slot), also once the rows are not the pool's entries in order."""
    g = torch.Generator().manual_seed(0)
    caches = [KVCache(1, 3, 2, 8, 4, torch.float32) for _ in range(2)]
    for c in caches:
        c.keep_rows(torch.tensor([2, 0]))  # row 0 is entry 2, row 1 entry 0
    k, v = torch.randn(2, 3, 2, 4, generator=g), torch.randn(2, 3, 2, 4, generator=g)
    pos = torch.tensor([[4, 5, 6], [1, caches[0].trash, caches[0].trash]])  # row 1 has one real entry
    caches[0].write(0, pos, k, v)
    b, t = (pos != caches[0].trash).nonzero(as_tuple=True)
    caches[1].write(0, pos[b, t][None], k[b, t][None], v[b, t][None], rows=b[None])
    padded, packed = caches[0].view(0, 8), caches[1].view(0, 8)  # every slot but the trash
    assert torch.equal(padded[0], packed[0]) and torch.equal(padded[1], packed[1])
    assert packed[0][0, :, 4:7].abs().sum() > 0 and packed[0][1, :, 1].abs().sum() > 0
