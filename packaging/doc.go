// Package packaging holds what a hypervisor host installs besides the
// binaries: the systemd units (vrdmad.service, vrdmad.socket,
// vrdmad-device@.socket), the environment file (vrdmad.default, installed
// as /etc/default/vrdmad) and, in deb/, the rest of the .deb: the
// machine-readable copyright file, the changelog, the maintainer scripts,
// the sysusers.d file of the vrdma user and the lintian overrides.
// scripts/deb.sh puts them, the binaries, their manual pages and bash
// completion into a .deb. Beside it, scripts/deb-qemu.sh packages the
// patched QEMU of scripts/qemu-build.sh as vrdma-qemu, with deb/qemu's
// copyright file, as /usr/lib/vrdma/bin/qemu-system-x86_64 (qemu_deb_test.go
// checks it).
//
// The package has no code: its tests build the .deb and check its contents
// and control fields, run lintian on it, install, upgrade, remove and purge
// it with dpkg in a scratch root, verify the units with systemd-analyze, run
// the packaged vrdmad with --metrics (promtool checks the scrape), and run
// every command's --help. They skip when a tool is missing, except under
// CI=true, where they fail instead.
//
// Non-goals: packaging for other distributions, and a Debian source package
// (the .deb is built from the tree with the upstream Go toolchain).
package packaging
