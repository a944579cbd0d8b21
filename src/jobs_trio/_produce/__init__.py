# Producers: enqueue and send events from code that is not Trio (jobs_trio.sync for blocking
# code, jobs_trio.aio for asyncio), into the same tables, through the same checks and SQL.
