// Package inspector checks the web inspector (internal/server/inspector)
// in a real browser (Chromium, driven by chromedp; without it the tests
// skip with the reason), as producer serve mounts it beside the HTTP API,
// against a real embedded NATS server and worker
// (internal/testsupport/inspectortest): logging in, the runs list,
// filters, search, the run page, cancel, rerun and start again. It is in the
// checks module so that chromedp is in no build of a program that imports
// jetflow; the inspector's HTTP tests are beside it, with the same harness.
package inspector
