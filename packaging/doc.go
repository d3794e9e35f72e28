// Package packaging holds what a hypervisor host installs besides the
// binaries: the systemd unit (vrdmad.service) and the environment file
// (vrdmad.default, installed as /etc/default/vrdmad). scripts/deb.sh puts
// them, the binaries and their manual pages into a .deb.
//
// The package has no code: its tests build the .deb and check its contents
// and control fields, verify the unit with systemd-analyze, and run the
// packaged vrdmad with --metrics. They skip when dpkg-deb or systemd-analyze
// is missing, except under CI=true, where they fail instead.
//
// Non-goals: packaging for other distributions, and starting the service
// on install (the host's administrator enables it).
package packaging
