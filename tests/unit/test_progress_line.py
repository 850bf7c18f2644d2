"""The driver's line per micro-batch (spark_jobs/pipeline.py: progress_line), from a query's lastProgress."""

from spark_jobs.supervise import progress_line


def test_the_line_gives_the_sinks_time_and_each_step_of_the_streaming_engine():
    progress = {"batchId": 73, "numInputRows": 51, "durationMs": {
        "triggerExecution": 1362, "addBatch": 948, "latestOffset": 210, "walCommit": 90, "queryPlanning": 40,
        "commitOffsets": 60, "getBatch": 0}}

    assert progress_line("cache", progress) == (
        "cache batch 73: 51 rows in 1362 ms (add batch 948 ms; commitOffsets 60; getBatch 0; latestOffset 210; "
        "queryPlanning 40; walCommit 90)")


def test_a_trigger_without_data_has_no_add_batch():
    assert progress_line("search", {"batchId": 68, "numInputRows": 0, "durationMs": {"triggerExecution": 4}}) == (
        "search batch 68: 0 rows in 4 ms (add batch None ms)")
