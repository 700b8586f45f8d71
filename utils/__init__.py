"""What every script shares and a reader of an algorithm may skip: the environment wrapper, fast
layers, the command line, checkpoints and resume, the TensorBoard log, model files, evaluation and
pictures."""
