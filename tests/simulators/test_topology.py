"""World shapes, the torchrun environment of each rank, and free ports (no processes started)."""
import multiprocessing
import socket

import pytest

from simulators.ports import DEFAULT_LAUNCH_PORTS, free_port, rotation
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


@pytest.mark.skipif(rotation() is None, reason="the kernel leaves no room below its ephemeral port range")
def test_free_ports_lie_below_the_kernels_ephemeral_range_and_skip_the_launchers_default():
    """gloo's listeners and outgoing connections draw from the ephemeral range: a port handed out there could be
    taken before rank 0 listens on it (two worlds then meet at one rendezvous)."""
    low = int(open("/proc/sys/net/ipv4/ip_local_port_range").read().split()[0])
    ports = [free_port() for _ in range(50)]
    assert all(port < low for port in ports), ports
    assert not set(ports) & set(DEFAULT_LAUNCH_PORTS), ports
    assert not {port + 1 for port in ports} & set(ports), "a port's next one stays free (MASTER_PORT + 1)"


def _ports_of_a_process(count: int) -> list[int]:
    return [free_port() for _ in range(count)]


@pytest.mark.skipif(rotation() is None, reason="the kernel leaves no room below its ephemeral port range")
def test_processes_side_by_side_never_get_the_same_port():
    with multiprocessing.get_context("spawn").Pool(3) as workers:
        handed = workers.map(_ports_of_a_process, [40, 40, 40])
    every = [port for ports in handed for port in ports]
    assert len(set(every)) == len(every), sorted(every)


@pytest.mark.skipif(rotation() is None, reason="the kernel leaves no room below its ephemeral port range")
def test_a_port_something_listens_on_is_passed_over():
    upcoming = free_port() + 2  # every other port is handed out
    try:
        holder = socket.create_server(("127.0.0.1", upcoming))
    except OSError:
        pytest.skip(f"port {upcoming} is taken already")
    with holder:
        assert free_port() != upcoming
