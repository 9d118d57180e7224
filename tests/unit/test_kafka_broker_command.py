"""The embedded broker's java command line: extra JVM options from ``KAFKA_OPTS``, as Kafka's
own scripts take them (the test suite passes its short-lived JVMs' flags there)."""

import pytest

from kbp_local.apache_kafka import KafkaBroker


def command(tmp_path) -> list[str]:
    broker = KafkaBroker(tmp_path / "kafka", heap="256m")
    broker._classpath = "/jars/a.jar:/jars/b.jar"
    return broker._java("kafka.Kafka", "server.properties")


def test_kafka_opts_go_last_before_the_main_class_and_win(tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:
    # as in Kafka's kafka-run-class.sh: a user's -Xmx or -Djava.io.tmpdir there wins over the defaults
    monkeypatch.setenv("KAFKA_OPTS", "-XX:+UseSerialGC  -Dkbp.note='two words' -Xmx1g")
    cmd = command(tmp_path)
    main = cmd.index("kafka.Kafka")
    assert cmd[main - 5 :] == [
        "-cp",
        "/jars/a.jar:/jars/b.jar",
        "-XX:+UseSerialGC",
        "-Dkbp.note=two words",
        "-Xmx1g",
        "kafka.Kafka",
        "server.properties",
    ]
    assert cmd.index("-Xmx256m") < cmd.index("-Xmx1g")


def test_without_kafka_opts_the_command_has_no_extra_option(
    tmp_path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("KAFKA_OPTS", raising=False)
    cmd = command(tmp_path)
    assert cmd[1:3] == ["-Xmx256m", f"-Djava.io.tmpdir={(tmp_path / 'kafka').resolve() / 'tmp'}"]
    assert cmd[3].startswith("-Dlog4j2.configurationFile=")
    assert cmd[4:] == ["-cp", "/jars/a.jar:/jars/b.jar", "kafka.Kafka", "server.properties"]
