"""Triton's three ports are three different ports, wherever they come from.

tritonserver given one port twice prints its usage and exits 1 without naming either port; CI
met it when `free_port()` three times in a row handed out one port twice (the kernel may reuse an
ephemeral port the moment its probe socket closes)."""

import socket
from dataclasses import fields

import pytest

from trtllm_dflash.errors import UserError
from trtllm_dflash.launch import server as launch
from trtllm_dflash.launch.server import Endpoints, TritonServer, free_ports
from trtllm_dflash.recipe import load_recipe
from trtllm_dflash.recipe.schema import RecipeError


class _ReusingKernel:
    """A socket whose bind to port 0 gets the lowest port no open socket holds: the reuse the
    kernel is allowed to do, made certain."""
    held: set[int] = set()

    def __init__(self, *_):
        self.port = None

    def bind(self, address):
        self.port = min(set(range(40000, 40100)) - self.held)
        self.held.add(self.port)

    def getsockname(self):
        return ("127.0.0.1", self.port)

    def close(self):
        self.held.discard(self.port)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def test_free_ports_are_different_even_when_the_kernel_reuses_closed_ports(monkeypatch):
    monkeypatch.setattr(launch.socket, "socket", _ReusingKernel)
    ports = free_ports(3)
    assert len(set(ports)) == 3
    assert len({launch.free_port() for _ in range(3)}) == 1  # what CI met: one port three times
    assert len({getattr(Endpoints.free(), f.name) for f in fields(Endpoints) if f.name != "host"}) == 3


def test_free_ports_are_free():
    for port in free_ports(3):
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.bind(("127.0.0.1", port))  # raises if a probe socket still held it


def test_endpoints_refuse_one_port_twice_by_name():
    with pytest.raises(UserError, match="http_port and metrics_port are both 8000"):
        Endpoints("127.0.0.1", 8000, 8001, 8000)


def test_recipe_refuses_one_port_twice_by_field():
    with pytest.raises(RecipeError, match=r"serve: grpc_port and metrics_port are both 8002; Triton needs three"):
        load_recipe(None, ["serve.grpc_port=8002"])


def test_a_refused_command_line_is_reported_as_one(tmp_path):
    """Should a bad command line reach tritonserver anyway, the error shows the command, not the
    usage text's lines that happen to contain 'error'."""
    pytest.importorskip("pytriton", reason="needs nvidia-pytriton's bundled tritonserver")
    (tmp_path / "repo" / "m").mkdir(parents=True)
    e = object.__new__(Endpoints)  # past the check above: what tritonserver does with one port twice
    http, metrics = free_ports(2)
    for name, value in (("host", "127.0.0.1"), ("http_port", http), ("grpc_port", http), ("metrics_port", metrics)):
        object.__setattr__(e, name, value)
    with pytest.raises(UserError, match=r"refused its command line \(it printed its usage\): --model-repository="):
        TritonServer(tmp_path / "repo", e).start(timeout_s=30)
