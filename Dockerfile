# The manager image. Not built in CI here (no container engine on these
# machines); `make docker-build` runs it where one exists. The Go build flags
# come from the Makefile (GO_BUILD_FLAGS), the same ones `make build` uses,
# so the binary inside is built exactly like the one the tests run.
# `make image` builds an equivalent image with no container engine
# (hack/image, go-containerregistry; docs/install.md#the-image).
FROM golang:1.26 AS build
ARG GO_BUILD_FLAGS="-trimpath -ldflags=-s -ldflags=-w"
WORKDIR /src
COPY go.mod go.sum ./
RUN go mod download
COPY api/ api/
COPY cmd/ cmd/
COPY controllers/ controllers/
COPY internal/ internal/
COPY pkg/ pkg/
COPY webhook/ webhook/
RUN CGO_ENABLED=0 go build ${GO_BUILD_FLAGS} -o /out/manager ./cmd/manager

FROM gcr.io/distroless/static:nonroot
COPY --from=build /out/manager /manager
USER 65532:65532
ENTRYPOINT ["/manager"]
