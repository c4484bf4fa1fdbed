"""Batches: many documents, many questions, on workers that may run on other machines.

    spec.py      what a batch asks and the key that names it (the same command resumes it)
    content.py   a document sent by content (text and page offsets), never by path
    worker.py    one worker: the engine loaded once, whole documents through the answer service
    pools.py     the pool interface, and the pool in this process
    ray_pool.py  the workers as Ray actors, locally or on a cluster, restarted when they die
    slots.py     several workers on one machine, each on cores of its own
    driver.py    what is left to do, progress, and the results written to the store (the one writer)
    export.py    the results as CSV, JSON Lines or Markdown
"""
