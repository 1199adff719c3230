"""The training configuration module of tests/training_programs.py (`import training_config`),
which the trainer edits between epochs (`training_config.IMAGE_SIZE = 20`)."""

IMAGE_SIZE = 12
