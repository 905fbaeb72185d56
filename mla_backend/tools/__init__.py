"""What users run beside the library: the benchmark and its peers, the demo, the doctor, and the
seeded DeepSeek-V3 checkpoint maker. The library core does not import them."""
