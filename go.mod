module github.com/vrdma/vrdma

go 1.26.8

require (
	github.com/digitalocean/go-qemu v0.0.0-20250212194115-ee9b0668d242
	github.com/google/uuid v1.6.0
	github.com/sirupsen/logrus v1.10.2
	golang.org/x/sys v0.50.0
)

require github.com/digitalocean/go-libvirt v0.0.0-20220804181439-8648fbde413e // indirect
