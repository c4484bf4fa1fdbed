"""What runs the model: model files (the default model, checks before loading), choosing and
opening an engine, the hardware report and the live decode rate."""
