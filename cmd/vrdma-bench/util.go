package main

import (
	"os"
	"strings"
)

func readFile(p string) (string, error) {
	b, err := os.ReadFile(p)
	return string(b), err
}

func splitLines(s string) []string { return strings.Split(s, "\n") }
