"""Batch jobs: the OpenAI Batch API (/v1/files, /v1/batches) and the Batches pages.

An input file is streamed to DATA_DIR/batches/ and validated line by line as
it arrives (validate.py); a batch is a Batch row plus one BatchLine row per
input line (its byte offset, never the text). A Celery task on the host
queue of the batch's deployment runs runner.Runner: an asyncio loop with
`concurrency` workers and a pacing gap, sending each line through the
gateway's own relay (views.proxy -> the engine, usage recorded per key), and
recording each result once: output bytes appended and fsynced first, then
the lines marked done in the transaction that also records how many bytes
of the output are committed. A restart truncates the files to those sizes
and sends again only lines without a recorded result.
"""
