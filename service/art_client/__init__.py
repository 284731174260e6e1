"""ART's own client trains here: the models, batches and checkpoints behind ``/v1/preview`` (the protocol of
``art.ServerlessBackend``: ../shared/ART-CLIENT-PROTOCOL.md, ART's ``art/serverless/``).

A model the client registers (registry.py) is a row naming it as the client does, and a training job that holds its
series: steps, alerts, curves and the dashboard read it as any job's. Each batch of trajectory groups the client posts
(batches.py) becomes a ``client_batch`` job that workers claim like any other, one at a time per model, and whose run
(runner.py) takes one GRPO step through the transformers backend, writing the events the client polls. Sampling names
the model as ART does (names.py): ``wandb-artifact:///{entity}/{project}/{name}[:step{N}]``.
"""

EVENT_KINDS = ("training_started", "gradient_step", "training_ended", "training_failed")  # what the client reads
