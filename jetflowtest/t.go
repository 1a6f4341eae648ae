package jetflowtest

// T is what the kit needs of a test: *testing.T and *testing.B have it.
// Pass the test's own t; a failure the kit finds is reported through it,
// and what the kit starts is stopped by the functions it registers with
// Cleanup.
type T interface {
	Helper()
	Name() string
	TempDir() string
	Cleanup(func())
	Log(args ...any)
	Logf(format string, args ...any)
	Errorf(format string, args ...any)
	Fatalf(format string, args ...any)
}
