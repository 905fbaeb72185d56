"""What users run beside the library (`python -m mla_backend doctor|demo|bench`): the doctor, the demo
and its seeded model, the benchmark with its peers and the SM90 route table. The library core does not
import them, and they import nothing of the test harness (integration/, dev/, tests/)."""
