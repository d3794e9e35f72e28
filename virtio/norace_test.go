//go:build !race

package virtio

const raceEnabled = false
