# skein's one image: the static binaries (make build: CGO_ENABLED=0) on
# nothing. `make image` builds the same image without a container engine
# (hack/mkimage) as bin/skein-image.tar; with an engine:
#   make build && docker build -t skein:dev .
# deploy/kubernetes runs each component from it by its binary's path.
FROM scratch
COPY bin/skeind bin/skein-controller bin/skeinctl bin/skein bin/skein-cni bin/skein-vm bin/skein-vmwrapper bin/skein-install bin/skein-egress bin/skein-sandbox-exec /usr/local/bin/
ENV PATH=/usr/local/bin
ENTRYPOINT ["/usr/local/bin/skeind"]
