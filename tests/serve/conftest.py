"""One served tiny pair per test process, shared by the server test modules that need nothing but
the default deployment (test_server, test_dialect_server, test_upstream_clients, test_client_wire,
test_dynamo: its Dynamo workers serve this deployment):
a tritonserver start, a convert and a deploy cost about 10 s each time. Tests that count take differences
(metrics, served request counts), so the order of the modules does not matter; under xdist
(`--dist loadfile`) each worker that gets one of these modules starts the server once."""

import pytest


@pytest.fixture(scope="session")
def default_served(tmp_path_factory):
    """(recipe, server) of serve_helpers.served_pair with its defaults."""
    from serve_helpers import served_pair

    with served_pair(tmp_path_factory.mktemp("default-served")) as pair:
        yield pair
