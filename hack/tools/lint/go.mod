// Builds golangci-lint for `make lint`; a module of its own so its many
// dependencies never touch the main module or the control-plane tools.
module github.com/fencekeeper/fencekeeper/hack/tools/lint

go 1.26.0

require github.com/golangci/golangci-lint/v2 v2.15.0
