// SPDX-License-Identifier: GPL-2.0 OR Linux-OpenIB
/*
 * dlopen PROVIDER as libibverbs would: after libibverbs.so.1 (RTLD_GLOBAL),
 * with RTLD_NOW, so every symbol the provider imports must resolve against
 * the system's library, with its version, or dlopen fails.
 */
#include <dlfcn.h>
#include <stdio.h>

int main(int argc, char **argv)
{
	void *verbs, *prov;

	if (argc != 2) {
		fprintf(stderr, "usage: %s PROVIDER.so\n", argv[0]);
		return 2;
	}
	verbs = dlopen("libibverbs.so.1", RTLD_NOW | RTLD_GLOBAL);
	if (!verbs) {
		fprintf(stderr, "dlopen libibverbs.so.1: %s\n", dlerror());
		return 1;
	}
	prov = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
	if (!prov) {
		fprintf(stderr, "dlopen %s: %s\n", argv[1], dlerror());
		return 1;
	}
	printf("loaded %s\n", argv[1]);
	return 0;
}
