"""kbp_local.process.free_ports: the ports a local server listens on are chosen together, each
distinct and none of those already given (a SeaweedFS server was once handed one port twice)."""

import socket

from kbp_local.apache_kafka import KafkaBroker
from kbp_local.process import free_ports, ports_beside
from kbp_local.s3 import S3Server


def test_ports_chosen_together_are_distinct_and_free():
    ports = free_ports(50)
    assert len(set(ports)) == 50
    for port in ports:  # nothing listens there: each binds again
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.bind(("127.0.0.1", port))


def test_ports_already_given_are_left_out():
    given = free_ports(5)
    assert not set(free_ports(50, besides=given)) & set(given)


def test_a_servers_ports_are_distinct(tmp_path):
    s3 = S3Server(tmp_path / "s3")
    assert len({s3.port, *s3.ports.values()}) == 1 + len(s3.ports) == 8
    broker = KafkaBroker(tmp_path / "kafka", secured=True)
    assert len({broker.port, broker.controller_port, broker.secured_port, broker.mtls_port}) == 4
    given = KafkaBroker(tmp_path / "kafka2", port=broker.port, advertised_port=broker.controller_port)
    assert given.controller_port not in (broker.port, broker.controller_port)


def test_a_given_port_is_kept_and_the_others_are_chosen_around_it():
    port, advertised = free_ports(2)
    kept, others = ports_beside(port, 3, besides=[advertised, None])
    assert kept == port and len(set(others)) == 3 and not {port, advertised} & set(others)
    chosen, others = ports_beside(None, 2)
    assert len({chosen, *others}) == 3
