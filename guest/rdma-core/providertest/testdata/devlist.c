// SPDX-License-Identifier: GPL-2.0 OR Linux-OpenIB
/*
 * List the devices libibverbs finds, one line each:
 *   device NAME node_type=N guid=XXXXXXXXXXXXXXXX
 * then "devices N". Compiled against the system's (44.0) verbs.h and run by
 * provider_test.go against a fake sysfs (SYSFS_PATH).
 */
#include <endian.h>
#include <inttypes.h>
#include <stdio.h>
#include <infiniband/verbs.h>

int main(void)
{
	struct ibv_device **list;
	int i, n;

	list = ibv_get_device_list(&n);
	if (!list) {
		perror("ibv_get_device_list");
		return 1;
	}
	for (i = 0; i < n; i++)
		printf("device %s node_type=%d guid=%016" PRIx64 "\n",
		       ibv_get_device_name(list[i]), (int)list[i]->node_type,
		       (uint64_t)be64toh(ibv_get_device_guid(list[i])));
	printf("devices %d\n", n);
	ibv_free_device_list(list);
	return 0;
}
