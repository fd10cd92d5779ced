"""Laying out an image's tree for Charliecloud writes only inside the tree, whatever links the image holds."""

from __future__ import annotations

from pathlib import Path

import pytest

from nodekit.backends.slurm.convert import lay_out
from nodekit.errors import UsageError


def test_the_layout_makes_chs_directories_files_mount_points_and_environment(tmp_path: Path) -> None:
    tree = tmp_path / "tree"
    tree.mkdir()
    lay_out(tree, ["/data/shards", "/outputs"], [("A", "1"), ("B", "x y")])
    assert (tree / "ch" / "environment").read_text() == "A=1\nB=x y\n"
    assert (tree / "data" / "shards").is_dir() and (tree / "outputs").is_dir() and (tree / "mnt" / "9").is_dir()
    assert (tree / "etc" / "hosts").is_file()


def test_links_in_the_image_are_never_followed_out_of_the_tree(tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    tree = tmp_path / "tree"
    tree.mkdir()
    # An image whose mount point's parent and /etc are absolute links (to this machine's directories, read
    # outside the container).
    (tree / "data").symlink_to(outside)
    (tree / "etc").symlink_to(outside)
    lay_out(tree, ["/data/shards"], [("A", "1")])
    assert list(outside.iterdir()) == []
    assert (tree / "ch" / "environment").read_text() == "A=1\n"


def test_an_environment_file_behind_a_link_is_refused_and_nothing_is_written(tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    tree = tmp_path / "tree"
    tree.mkdir()
    (tree / "ch").symlink_to(outside)
    with pytest.raises(UsageError):
        lay_out(tree, [], [("A", "1")])
    assert list(outside.iterdir()) == []
