package jetflow

const childEnv = "JETFLOW_TEST_CHILD"

func runChildWorker() int { return 0 }
