from airflow_kafka_backpressure.operators.spark_job import _job_error, executor_conf, is_loopback_master


def test_executor_conf_per_cluster_manager():
    assert executor_conf("spark://h:7077", 3, 2) == {
        "spark.executor.cores": "2", "spark.cores.max": "6", "spark.scheduler.minRegisteredResourcesRatio": "1.0"}
    assert executor_conf("yarn", 3, 2) == {"spark.executor.instances": "3", "spark.executor.cores": "2"}
    assert executor_conf("k8s://https://api:6443", 4, 1)["spark.executor.instances"] == "4"
    assert executor_conf("local[2]", 3, 1) == {}


def test_loopback_masters_bind_spark_to_loopback():
    assert is_loopback_master("local[2]")
    assert is_loopback_master("spark://127.0.0.1:7077")
    assert is_loopback_master("spark://localhost:7077,127.0.0.1:7078")
    assert not is_loopback_master("spark://10.0.0.5:7077")
    assert not is_loopback_master("yarn")


def test_job_error_prefers_the_jobs_own_line():
    e = RuntimeError("Cannot execute: spark-submit ...\nblah\nKBP_ERROR batch 7: range t-0[5, 9) is past latest 6\nmore")
    assert _job_error(e) == "batch 7: range t-0[5, 9) is past latest 6"
    assert _job_error(RuntimeError("plain")) == "plain"
