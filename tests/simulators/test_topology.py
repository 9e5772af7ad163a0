"""World shapes, the torchrun environment of each rank, and free ports (no processes started)."""
import socket

import pytest

from simulators.ports import free_port
from simulators.topology import World, rank_env

WORLDS = ["1", "2", "3", "4", "2x2"]


@pytest.mark.parametrize(
    "text, machines, per_machine, size",
    [("1", 1, 1, 1), ("4", 1, 4, 4), ("2x2", 2, 2, 4), ("3x1", 3, 1, 3), (" 2X3 ", 2, 3, 6)],
)
def test_parse(text, machines, per_machine, size):
    world = World.parse(text)
    assert (world.machines, world.ranks_per_machine, world.size) == (machines, per_machine, size)


@pytest.mark.parametrize("text", WORLDS)
def test_label_round_trips(text):
    assert World.parse(text).label == text


def test_of():
    assert World.of(4) == World(1, 4)
    assert World.of(4, machines=2) == World(2, 2)
    assert World.of(4, machines=2).label == "2x2"


@pytest.mark.parametrize(
    "make, names",
    [
        (lambda: World.of(0), "size=0"),
        (lambda: World.of(-2), "size=-2"),
        (lambda: World.of(4, machines=0), "machines=0"),
        (lambda: World.of(5, machines=2), "5"),
        (lambda: World(0, 2), "machines=0"),
        (lambda: World(2, 0), "ranks_per_machine=0"),
        (lambda: World.parse("0"), "size=0"),
        (lambda: World.parse("0x2"), "machines=0"),
        (lambda: World.parse("two"), "'two'"),
        (lambda: World.parse("1x2x3"), "'1x2x3'"),
    ],
)
def test_bad_worlds_raise_naming_the_value(make, names):
    with pytest.raises(ValueError, match=names):
        make()


@pytest.mark.parametrize("text", WORLDS)
def test_rank_env_follows_torchrun(text):
    world = World.parse(text)
    envs = [rank_env(world, rank, 29555) for rank in range(world.size)]
    for rank, env in enumerate(envs):
        machine = rank // world.ranks_per_machine
        assert env["RANK"] == env["ROLE_RANK"] == str(rank)
        assert env["WORLD_SIZE"] == env["ROLE_WORLD_SIZE"] == str(world.size)
        assert env["LOCAL_RANK"] == str(rank % world.ranks_per_machine)
        assert env["LOCAL_WORLD_SIZE"] == str(world.ranks_per_machine)
        assert env["NODE_RANK"] == env["GROUP_RANK"] == str(machine)
        assert env["MASTER_ADDR"] == "127.0.0.1"
        assert env["MASTER_PORT"] == "29555"
        assert env["OMP_NUM_THREADS"] == "1"
        assert env["PYTHONUNBUFFERED"] == "1"


def test_two_machines_of_two():
    world = World.parse("2x2")
    assert [(e["NODE_RANK"], e["LOCAL_RANK"]) for e in (rank_env(world, r, 1) for r in range(4))] == [
        ("0", "0"), ("0", "1"), ("1", "0"), ("1", "1")]


@pytest.mark.parametrize("rank", [-1, 4])
def test_rank_outside_world(rank):
    with pytest.raises(ValueError, match=str(rank)):
        rank_env(World.of(4), rank, 1)


def test_free_ports_are_distinct_and_bindable_on_loopback():
    ports = [free_port() for _ in range(20)]
    assert len(set(ports)) == len(ports)
    for port in ports[:3]:
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", port))
