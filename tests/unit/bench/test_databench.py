"""benchmarks/_databench.py: the dataset's shape at any scale, and verdicts that never claim a target a run did
not measure."""

from __future__ import annotations

from benchmarks._databench import Shape, table, verdicts


def test_a_scaled_dataset_keeps_its_small_files_sizes_and_shrinks_their_number() -> None:
    full, tenth = Shape.of(1), Shape.of(0.1)
    assert (full.files, full.large, full.large_mib) == (20_000, 4, 256)
    assert 1.9 * 2**30 < full.total < 2.1 * 2**30
    assert tenth.files == 2_000 and tenth.small_kib == full.small_kib
    for shape in (full, tenth):
        sizes = [shape.small_size(i) for i in range(shape.files)]
        assert abs(sum(sizes) / len(sizes) - shape.small_kib * 1024) < 0.01 * shape.small_kib * 1024
        assert min(sizes) >= shape.small_kib * 512


def test_a_target_whose_side_was_not_measured_is_undecided_not_met() -> None:
    one = {"seconds": 10.0, "link_bytes": 2 << 30}
    results = {"runs": {"1": {"nodekit": {"first": one}}, "4": {"nodekit": {"first": {**one, "seconds": 12.0}}}}}
    said = "\n".join(verdicts(results))
    assert "4 hosts within 1.3x its own time to 1 host: **met**" in said
    assert "beats parallel rsync at 4 hosts: not decided" in said and "rsync at 4 hosts: **" not in said
    assert table(results)[2] == "| 1 | first push | 10.0 s, 2.00 GiB | - | - |"


def test_the_cores_busy_and_the_hosts_a_tree_fed_are_shown_where_measured() -> None:
    """Every virtual host runs on this machine's cores: a run says how busy they were, so a push to 8 hosts that
    is bound by them is not read as the link's figure."""
    one = {"seconds": 10.0, "link_bytes": 2 << 30, "busy": 0.4}
    many = {"seconds": 20.0, "link_bytes": 2 << 30, "busy": 0.98, "relayed": 7}
    results = {"runs": {"1": {"nodekit": {"first": one}}, "8": {"nodekit": {"first": many}}}}
    said = "\n".join(verdicts(results))
    assert "**NOT met**" in said and "cores were 98% busy during it, 40% during the push to 1 host" in said
    assert table(results)[3] == "| 8 | first push | 20.0 s, 2.00 GiB, cores 98% busy, relayed to 7 | - | - |"
