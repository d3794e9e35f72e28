// SPDX-License-Identifier: GPL-2.0 OR Linux-OpenIB
/*
 * abi_check.c: the provider is compiled against rdma-core 56.1's headers and
 * loaded by Debian 12's libibverbs 44.0. Both declare provider ABI 34
 * (IBVERBS_PRIVATE_34), so the structures they share must be laid out the
 * same. Every number below was measured by compiling against rdma-core
 * v44.0's libibverbs/verbs.h (identical to Debian 12's
 * /usr/include/infiniband/verbs.h) and libibverbs/driver.h; this file is
 * compiled against the headers the provider is built with
 * (scripts/guest-provider.sh runs it with -fsyntax-only), so a header set that
 * moves any of these fails the build.
 *
 * Generated once from the v44.0 headers; regenerate only to add entries.
 * The three known differences between 44.0 and 56.1 are checked by hand at
 * the end, with why each is harmless.
 */
#include <stddef.h>
#include <assert.h>
#include <infiniband/driver.h>

#include "vrdma_abi.h"

#define SAME(expr, v44) static_assert((expr) == (v44), #expr " differs from rdma-core 44.0")


/* libibverbs/verbs.h (public) */
SAME(sizeof(struct ibv_device), 664);
SAME(offsetof(struct ibv_device, node_type), 16);
SAME(offsetof(struct ibv_device, transport_type), 20);
SAME(offsetof(struct ibv_device, name), 24);
SAME(offsetof(struct ibv_device, dev_name), 88);
SAME(offsetof(struct ibv_device, dev_path), 152);
SAME(offsetof(struct ibv_device, ibdev_path), 408);
SAME(sizeof(struct ibv_context), 328);
SAME(offsetof(struct ibv_context, device), 0);
SAME(offsetof(struct ibv_context, ops), 8);
SAME(offsetof(struct ibv_context, cmd_fd), 264);
SAME(offsetof(struct ibv_context, async_fd), 268);
SAME(offsetof(struct ibv_context, num_comp_vectors), 272);
SAME(offsetof(struct ibv_context, mutex), 280);
SAME(offsetof(struct ibv_context, abi_compat), 320);
SAME(sizeof(struct ibv_pd), 16);
SAME(offsetof(struct ibv_pd, context), 0);
SAME(offsetof(struct ibv_pd, handle), 8);
SAME(sizeof(struct ibv_mr), 48);
SAME(offsetof(struct ibv_mr, context), 0);
SAME(offsetof(struct ibv_mr, pd), 8);
SAME(offsetof(struct ibv_mr, addr), 16);
SAME(offsetof(struct ibv_mr, length), 24);
SAME(offsetof(struct ibv_mr, handle), 32);
SAME(offsetof(struct ibv_mr, lkey), 36);
SAME(offsetof(struct ibv_mr, rkey), 40);
SAME(sizeof(struct ibv_ah), 24);
SAME(offsetof(struct ibv_ah, context), 0);
SAME(offsetof(struct ibv_ah, pd), 8);
SAME(offsetof(struct ibv_ah, handle), 16);
SAME(sizeof(struct ibv_comp_channel), 16);
SAME(offsetof(struct ibv_comp_channel, context), 0);
SAME(offsetof(struct ibv_comp_channel, fd), 8);
SAME(offsetof(struct ibv_comp_channel, refcnt), 12);
SAME(sizeof(struct ibv_cq), 128);
SAME(offsetof(struct ibv_cq, context), 0);
SAME(offsetof(struct ibv_cq, channel), 8);
SAME(offsetof(struct ibv_cq, cq_context), 16);
SAME(offsetof(struct ibv_cq, handle), 24);
SAME(offsetof(struct ibv_cq, cqe), 28);
SAME(offsetof(struct ibv_cq, mutex), 32);
SAME(offsetof(struct ibv_cq, cond), 72);
SAME(offsetof(struct ibv_cq, comp_events_completed), 120);
SAME(offsetof(struct ibv_cq, async_events_completed), 124);
SAME(sizeof(struct ibv_cq_ex), 288);
SAME(offsetof(struct ibv_cq_ex, context), 0);
SAME(offsetof(struct ibv_cq_ex, channel), 8);
SAME(offsetof(struct ibv_cq_ex, cq_context), 16);
SAME(offsetof(struct ibv_cq_ex, handle), 24);
SAME(offsetof(struct ibv_cq_ex, cqe), 28);
SAME(offsetof(struct ibv_cq_ex, mutex), 32);
SAME(offsetof(struct ibv_cq_ex, cond), 72);
SAME(offsetof(struct ibv_cq_ex, comp_events_completed), 120);
SAME(offsetof(struct ibv_cq_ex, async_events_completed), 124);
SAME(offsetof(struct ibv_cq_ex, comp_mask), 128);
SAME(offsetof(struct ibv_cq_ex, status), 132);
SAME(offsetof(struct ibv_cq_ex, wr_id), 136);
SAME(offsetof(struct ibv_cq_ex, start_poll), 144);
SAME(offsetof(struct ibv_cq_ex, next_poll), 152);
SAME(offsetof(struct ibv_cq_ex, end_poll), 160);
SAME(offsetof(struct ibv_cq_ex, read_opcode), 168);
SAME(offsetof(struct ibv_cq_ex, read_vendor_err), 176);
SAME(offsetof(struct ibv_cq_ex, read_byte_len), 184);
SAME(offsetof(struct ibv_cq_ex, read_imm_data), 192);
SAME(offsetof(struct ibv_cq_ex, read_qp_num), 200);
SAME(offsetof(struct ibv_cq_ex, read_src_qp), 208);
SAME(offsetof(struct ibv_cq_ex, read_wc_flags), 216);
SAME(offsetof(struct ibv_cq_ex, read_slid), 224);
SAME(offsetof(struct ibv_cq_ex, read_sl), 232);
SAME(offsetof(struct ibv_cq_ex, read_dlid_path_bits), 240);
SAME(offsetof(struct ibv_cq_ex, read_completion_ts), 248);
SAME(offsetof(struct ibv_cq_ex, read_cvlan), 256);
SAME(offsetof(struct ibv_cq_ex, read_flow_tag), 264);
SAME(offsetof(struct ibv_cq_ex, read_tm_info), 272);
SAME(offsetof(struct ibv_cq_ex, read_completion_wallclock_ns), 280);
SAME(sizeof(struct ibv_qp), 160);
SAME(offsetof(struct ibv_qp, context), 0);
SAME(offsetof(struct ibv_qp, qp_context), 8);
SAME(offsetof(struct ibv_qp, pd), 16);
SAME(offsetof(struct ibv_qp, send_cq), 24);
SAME(offsetof(struct ibv_qp, recv_cq), 32);
SAME(offsetof(struct ibv_qp, srq), 40);
SAME(offsetof(struct ibv_qp, handle), 48);
SAME(offsetof(struct ibv_qp, qp_num), 52);
SAME(offsetof(struct ibv_qp, state), 56);
SAME(offsetof(struct ibv_qp, qp_type), 60);
SAME(offsetof(struct ibv_qp, mutex), 64);
SAME(offsetof(struct ibv_qp, cond), 104);
SAME(offsetof(struct ibv_qp, events_completed), 152);
SAME(sizeof(struct ibv_wc), 48);
SAME(offsetof(struct ibv_wc, wr_id), 0);
SAME(offsetof(struct ibv_wc, status), 8);
SAME(offsetof(struct ibv_wc, opcode), 12);
SAME(offsetof(struct ibv_wc, vendor_err), 16);
SAME(offsetof(struct ibv_wc, byte_len), 20);
SAME(offsetof(struct ibv_wc, imm_data), 24);
SAME(offsetof(struct ibv_wc, qp_num), 28);
SAME(offsetof(struct ibv_wc, src_qp), 32);
SAME(offsetof(struct ibv_wc, wc_flags), 36);
SAME(offsetof(struct ibv_wc, pkey_index), 40);
SAME(offsetof(struct ibv_wc, slid), 42);
SAME(offsetof(struct ibv_wc, sl), 44);
SAME(offsetof(struct ibv_wc, dlid_path_bits), 45);
SAME(sizeof(struct ibv_sge), 16);
SAME(offsetof(struct ibv_sge, addr), 0);
SAME(offsetof(struct ibv_sge, length), 8);
SAME(offsetof(struct ibv_sge, lkey), 12);
SAME(sizeof(struct ibv_send_wr), 128);
SAME(offsetof(struct ibv_send_wr, wr_id), 0);
SAME(offsetof(struct ibv_send_wr, next), 8);
SAME(offsetof(struct ibv_send_wr, sg_list), 16);
SAME(offsetof(struct ibv_send_wr, num_sge), 24);
SAME(offsetof(struct ibv_send_wr, opcode), 28);
SAME(offsetof(struct ibv_send_wr, send_flags), 32);
SAME(offsetof(struct ibv_send_wr, imm_data), 36);
SAME(offsetof(struct ibv_send_wr, wr.rdma.remote_addr), 40);
SAME(offsetof(struct ibv_send_wr, wr.rdma.rkey), 48);
SAME(offsetof(struct ibv_send_wr, wr.atomic.remote_addr), 40);
SAME(offsetof(struct ibv_send_wr, wr.atomic.compare_add), 48);
SAME(offsetof(struct ibv_send_wr, wr.atomic.swap), 56);
SAME(offsetof(struct ibv_send_wr, wr.atomic.rkey), 64);
SAME(offsetof(struct ibv_send_wr, qp_type), 72);
SAME(offsetof(struct ibv_send_wr, bind_mw), 80);
SAME(offsetof(struct ibv_send_wr, tso), 80);
SAME(sizeof(struct ibv_recv_wr), 32);
SAME(offsetof(struct ibv_recv_wr, wr_id), 0);
SAME(offsetof(struct ibv_recv_wr, next), 8);
SAME(offsetof(struct ibv_recv_wr, sg_list), 16);
SAME(offsetof(struct ibv_recv_wr, num_sge), 24);
SAME(sizeof(struct ibv_qp_cap), 20);
SAME(offsetof(struct ibv_qp_cap, max_send_wr), 0);
SAME(offsetof(struct ibv_qp_cap, max_recv_wr), 4);
SAME(offsetof(struct ibv_qp_cap, max_send_sge), 8);
SAME(offsetof(struct ibv_qp_cap, max_recv_sge), 12);
SAME(offsetof(struct ibv_qp_cap, max_inline_data), 16);
SAME(sizeof(struct ibv_qp_init_attr), 64);
SAME(offsetof(struct ibv_qp_init_attr, qp_context), 0);
SAME(offsetof(struct ibv_qp_init_attr, send_cq), 8);
SAME(offsetof(struct ibv_qp_init_attr, recv_cq), 16);
SAME(offsetof(struct ibv_qp_init_attr, srq), 24);
SAME(offsetof(struct ibv_qp_init_attr, cap), 32);
SAME(offsetof(struct ibv_qp_init_attr, qp_type), 52);
SAME(offsetof(struct ibv_qp_init_attr, sq_sig_all), 56);
SAME(sizeof(struct ibv_qp_attr), 144);
SAME(offsetof(struct ibv_qp_attr, qp_state), 0);
SAME(offsetof(struct ibv_qp_attr, cur_qp_state), 4);
SAME(offsetof(struct ibv_qp_attr, path_mtu), 8);
SAME(offsetof(struct ibv_qp_attr, path_mig_state), 12);
SAME(offsetof(struct ibv_qp_attr, qkey), 16);
SAME(offsetof(struct ibv_qp_attr, rq_psn), 20);
SAME(offsetof(struct ibv_qp_attr, sq_psn), 24);
SAME(offsetof(struct ibv_qp_attr, dest_qp_num), 28);
SAME(offsetof(struct ibv_qp_attr, qp_access_flags), 32);
SAME(offsetof(struct ibv_qp_attr, cap), 36);
SAME(offsetof(struct ibv_qp_attr, ah_attr), 56);
SAME(offsetof(struct ibv_qp_attr, alt_ah_attr), 88);
SAME(offsetof(struct ibv_qp_attr, pkey_index), 120);
SAME(offsetof(struct ibv_qp_attr, alt_pkey_index), 122);
SAME(offsetof(struct ibv_qp_attr, en_sqd_async_notify), 124);
SAME(offsetof(struct ibv_qp_attr, sq_draining), 125);
SAME(offsetof(struct ibv_qp_attr, max_rd_atomic), 126);
SAME(offsetof(struct ibv_qp_attr, max_dest_rd_atomic), 127);
SAME(offsetof(struct ibv_qp_attr, min_rnr_timer), 128);
SAME(offsetof(struct ibv_qp_attr, port_num), 129);
SAME(offsetof(struct ibv_qp_attr, timeout), 130);
SAME(offsetof(struct ibv_qp_attr, retry_cnt), 131);
SAME(offsetof(struct ibv_qp_attr, rnr_retry), 132);
SAME(offsetof(struct ibv_qp_attr, alt_port_num), 133);
SAME(offsetof(struct ibv_qp_attr, alt_timeout), 134);
SAME(offsetof(struct ibv_qp_attr, rate_limit), 136);
SAME(sizeof(struct ibv_global_route), 24);
SAME(offsetof(struct ibv_global_route, dgid), 0);
SAME(offsetof(struct ibv_global_route, flow_label), 16);
SAME(offsetof(struct ibv_global_route, sgid_index), 20);
SAME(offsetof(struct ibv_global_route, hop_limit), 21);
SAME(offsetof(struct ibv_global_route, traffic_class), 22);
SAME(sizeof(struct ibv_ah_attr), 32);
SAME(offsetof(struct ibv_ah_attr, grh), 0);
SAME(offsetof(struct ibv_ah_attr, dlid), 24);
SAME(offsetof(struct ibv_ah_attr, sl), 26);
SAME(offsetof(struct ibv_ah_attr, src_path_bits), 27);
SAME(offsetof(struct ibv_ah_attr, static_rate), 28);
SAME(offsetof(struct ibv_ah_attr, is_global), 29);
SAME(offsetof(struct ibv_ah_attr, port_num), 30);
SAME(sizeof(struct ibv_device_attr), 232);
SAME(offsetof(struct ibv_device_attr, fw_ver), 0);
SAME(offsetof(struct ibv_device_attr, node_guid), 64);
SAME(offsetof(struct ibv_device_attr, sys_image_guid), 72);
SAME(offsetof(struct ibv_device_attr, max_mr_size), 80);
SAME(offsetof(struct ibv_device_attr, page_size_cap), 88);
SAME(offsetof(struct ibv_device_attr, vendor_id), 96);
SAME(offsetof(struct ibv_device_attr, vendor_part_id), 100);
SAME(offsetof(struct ibv_device_attr, hw_ver), 104);
SAME(offsetof(struct ibv_device_attr, max_qp), 108);
SAME(offsetof(struct ibv_device_attr, max_qp_wr), 112);
SAME(offsetof(struct ibv_device_attr, device_cap_flags), 116);
SAME(offsetof(struct ibv_device_attr, max_sge), 120);
SAME(offsetof(struct ibv_device_attr, max_sge_rd), 124);
SAME(offsetof(struct ibv_device_attr, max_cq), 128);
SAME(offsetof(struct ibv_device_attr, max_cqe), 132);
SAME(offsetof(struct ibv_device_attr, max_mr), 136);
SAME(offsetof(struct ibv_device_attr, max_pd), 140);
SAME(offsetof(struct ibv_device_attr, max_qp_rd_atom), 144);
SAME(offsetof(struct ibv_device_attr, max_ee_rd_atom), 148);
SAME(offsetof(struct ibv_device_attr, max_res_rd_atom), 152);
SAME(offsetof(struct ibv_device_attr, max_qp_init_rd_atom), 156);
SAME(offsetof(struct ibv_device_attr, max_ee_init_rd_atom), 160);
SAME(offsetof(struct ibv_device_attr, atomic_cap), 164);
SAME(offsetof(struct ibv_device_attr, max_ee), 168);
SAME(offsetof(struct ibv_device_attr, max_rdd), 172);
SAME(offsetof(struct ibv_device_attr, max_mw), 176);
SAME(offsetof(struct ibv_device_attr, max_raw_ipv6_qp), 180);
SAME(offsetof(struct ibv_device_attr, max_raw_ethy_qp), 184);
SAME(offsetof(struct ibv_device_attr, max_mcast_grp), 188);
SAME(offsetof(struct ibv_device_attr, max_mcast_qp_attach), 192);
SAME(offsetof(struct ibv_device_attr, max_total_mcast_qp_attach), 196);
SAME(offsetof(struct ibv_device_attr, max_ah), 200);
SAME(offsetof(struct ibv_device_attr, max_fmr), 204);
SAME(offsetof(struct ibv_device_attr, max_map_per_fmr), 208);
SAME(offsetof(struct ibv_device_attr, max_srq), 212);
SAME(offsetof(struct ibv_device_attr, max_srq_wr), 216);
SAME(offsetof(struct ibv_device_attr, max_srq_sge), 220);
SAME(offsetof(struct ibv_device_attr, max_pkeys), 224);
SAME(offsetof(struct ibv_device_attr, local_ca_ack_delay), 226);
SAME(offsetof(struct ibv_device_attr, phys_port_cnt), 227);
SAME(sizeof(struct ibv_device_attr_ex), 400);
SAME(offsetof(struct ibv_device_attr_ex, orig_attr), 0);
SAME(offsetof(struct ibv_device_attr_ex, comp_mask), 232);
SAME(offsetof(struct ibv_device_attr_ex, odp_caps), 240);
SAME(offsetof(struct ibv_device_attr_ex, completion_timestamp_mask), 264);
SAME(offsetof(struct ibv_device_attr_ex, hca_core_clock), 272);
SAME(offsetof(struct ibv_device_attr_ex, device_cap_flags_ex), 280);
SAME(offsetof(struct ibv_device_attr_ex, tso_caps), 288);
SAME(offsetof(struct ibv_device_attr_ex, rss_caps), 296);
SAME(offsetof(struct ibv_device_attr_ex, max_wq_type_rq), 328);
SAME(offsetof(struct ibv_device_attr_ex, packet_pacing_caps), 332);
SAME(offsetof(struct ibv_device_attr_ex, raw_packet_caps), 344);
SAME(offsetof(struct ibv_device_attr_ex, tm_caps), 348);
SAME(offsetof(struct ibv_device_attr_ex, cq_mod_caps), 368);
SAME(offsetof(struct ibv_device_attr_ex, max_dm_size), 376);
SAME(offsetof(struct ibv_device_attr_ex, pci_atomic_caps), 384);
SAME(offsetof(struct ibv_device_attr_ex, xrc_odp_caps), 392);
SAME(offsetof(struct ibv_device_attr_ex, phys_port_cnt_ex), 396);
SAME(sizeof(struct ibv_query_device_ex_input), 4);
SAME(offsetof(struct ibv_query_device_ex_input, comp_mask), 0);
SAME(offsetof(struct ibv_port_attr, state), 0);
SAME(offsetof(struct ibv_port_attr, max_mtu), 4);
SAME(offsetof(struct ibv_port_attr, active_mtu), 8);
SAME(offsetof(struct ibv_port_attr, gid_tbl_len), 12);
SAME(offsetof(struct ibv_port_attr, port_cap_flags), 16);
SAME(offsetof(struct ibv_port_attr, max_msg_sz), 20);
SAME(offsetof(struct ibv_port_attr, bad_pkey_cntr), 24);
SAME(offsetof(struct ibv_port_attr, qkey_viol_cntr), 28);
SAME(offsetof(struct ibv_port_attr, pkey_tbl_len), 32);
SAME(offsetof(struct ibv_port_attr, lid), 34);
SAME(offsetof(struct ibv_port_attr, sm_lid), 36);
SAME(offsetof(struct ibv_port_attr, lmc), 38);
SAME(offsetof(struct ibv_port_attr, max_vl_num), 39);
SAME(offsetof(struct ibv_port_attr, sm_sl), 40);
SAME(offsetof(struct ibv_port_attr, subnet_timeout), 41);
SAME(offsetof(struct ibv_port_attr, init_type_reply), 42);
SAME(offsetof(struct ibv_port_attr, active_width), 43);
SAME(offsetof(struct ibv_port_attr, active_speed), 44);
SAME(offsetof(struct ibv_port_attr, phys_state), 45);
SAME(offsetof(struct ibv_port_attr, link_layer), 46);
SAME(offsetof(struct ibv_port_attr, flags), 47);
SAME(offsetof(struct ibv_port_attr, port_cap_flags2), 48);
SAME(offsetof(struct ibv_qp_ex, qp_base), 0);
SAME(offsetof(struct ibv_qp_ex, comp_mask), 160);
SAME(offsetof(struct ibv_qp_ex, wr_id), 168);
SAME(offsetof(struct ibv_qp_ex, wr_flags), 176);
SAME(offsetof(struct ibv_qp_ex, wr_atomic_cmp_swp), 184);
SAME(offsetof(struct ibv_qp_ex, wr_atomic_fetch_add), 192);
SAME(offsetof(struct ibv_qp_ex, wr_bind_mw), 200);
SAME(offsetof(struct ibv_qp_ex, wr_local_inv), 208);
SAME(offsetof(struct ibv_qp_ex, wr_rdma_read), 216);
SAME(offsetof(struct ibv_qp_ex, wr_rdma_write), 224);
SAME(offsetof(struct ibv_qp_ex, wr_rdma_write_imm), 232);
SAME(offsetof(struct ibv_qp_ex, wr_send), 240);
SAME(offsetof(struct ibv_qp_ex, wr_send_imm), 248);
SAME(offsetof(struct ibv_qp_ex, wr_send_inv), 256);
SAME(offsetof(struct ibv_qp_ex, wr_send_tso), 264);
SAME(offsetof(struct ibv_qp_ex, wr_set_ud_addr), 272);
SAME(offsetof(struct ibv_qp_ex, wr_set_xrc_srqn), 280);
SAME(offsetof(struct ibv_qp_ex, wr_set_inline_data), 288);
SAME(offsetof(struct ibv_qp_ex, wr_set_inline_data_list), 296);
SAME(offsetof(struct ibv_qp_ex, wr_set_sge), 304);
SAME(offsetof(struct ibv_qp_ex, wr_set_sge_list), 312);
SAME(offsetof(struct ibv_qp_ex, wr_start), 320);
SAME(offsetof(struct ibv_qp_ex, wr_complete), 328);
SAME(offsetof(struct ibv_qp_ex, wr_abort), 336);
SAME(offsetof(struct ibv_qp_ex, wr_atomic_write), 344);
SAME(offsetof(struct ibv_context_ops, _compat_query_device), 0);
SAME(offsetof(struct ibv_context_ops, _compat_query_port), 8);
SAME(offsetof(struct ibv_context_ops, _compat_alloc_pd), 16);
SAME(offsetof(struct ibv_context_ops, _compat_dealloc_pd), 24);
SAME(offsetof(struct ibv_context_ops, _compat_reg_mr), 32);
SAME(offsetof(struct ibv_context_ops, _compat_rereg_mr), 40);
SAME(offsetof(struct ibv_context_ops, _compat_dereg_mr), 48);
SAME(offsetof(struct ibv_context_ops, alloc_mw), 56);
SAME(offsetof(struct ibv_context_ops, bind_mw), 64);
SAME(offsetof(struct ibv_context_ops, dealloc_mw), 72);
SAME(offsetof(struct ibv_context_ops, _compat_create_cq), 80);
SAME(offsetof(struct ibv_context_ops, poll_cq), 88);
SAME(offsetof(struct ibv_context_ops, req_notify_cq), 96);
SAME(offsetof(struct ibv_context_ops, _compat_cq_event), 104);
SAME(offsetof(struct ibv_context_ops, _compat_resize_cq), 112);
SAME(offsetof(struct ibv_context_ops, _compat_destroy_cq), 120);
SAME(offsetof(struct ibv_context_ops, _compat_create_srq), 128);
SAME(offsetof(struct ibv_context_ops, _compat_modify_srq), 136);
SAME(offsetof(struct ibv_context_ops, _compat_query_srq), 144);
SAME(offsetof(struct ibv_context_ops, _compat_destroy_srq), 152);
SAME(offsetof(struct ibv_context_ops, post_srq_recv), 160);
SAME(offsetof(struct ibv_context_ops, _compat_create_qp), 168);
SAME(offsetof(struct ibv_context_ops, _compat_query_qp), 176);
SAME(offsetof(struct ibv_context_ops, _compat_modify_qp), 184);
SAME(offsetof(struct ibv_context_ops, _compat_destroy_qp), 192);
SAME(offsetof(struct ibv_context_ops, post_send), 200);
SAME(offsetof(struct ibv_context_ops, post_recv), 208);
SAME(offsetof(struct ibv_context_ops, _compat_create_ah), 216);
SAME(offsetof(struct ibv_context_ops, _compat_destroy_ah), 224);
SAME(offsetof(struct ibv_context_ops, _compat_attach_mcast), 232);
SAME(offsetof(struct ibv_context_ops, _compat_detach_mcast), 240);
SAME(offsetof(struct ibv_context_ops, _compat_async_event), 248);
SAME(sizeof(struct ibv_context_ops), 256);
SAME(offsetof(struct verbs_context, query_port), 0);
SAME(offsetof(struct verbs_context, advise_mr), 8);
SAME(offsetof(struct verbs_context, alloc_null_mr), 16);
SAME(offsetof(struct verbs_context, read_counters), 24);
SAME(offsetof(struct verbs_context, attach_counters_point_flow), 32);
SAME(offsetof(struct verbs_context, create_counters), 40);
SAME(offsetof(struct verbs_context, destroy_counters), 48);
SAME(offsetof(struct verbs_context, reg_dm_mr), 56);
SAME(offsetof(struct verbs_context, alloc_dm), 64);
SAME(offsetof(struct verbs_context, free_dm), 72);
SAME(offsetof(struct verbs_context, modify_flow_action_esp), 80);
SAME(offsetof(struct verbs_context, destroy_flow_action), 88);
SAME(offsetof(struct verbs_context, create_flow_action_esp), 96);
SAME(offsetof(struct verbs_context, modify_qp_rate_limit), 104);
SAME(offsetof(struct verbs_context, alloc_parent_domain), 112);
SAME(offsetof(struct verbs_context, dealloc_td), 120);
SAME(offsetof(struct verbs_context, alloc_td), 128);
SAME(offsetof(struct verbs_context, modify_cq), 136);
SAME(offsetof(struct verbs_context, post_srq_ops), 144);
SAME(offsetof(struct verbs_context, destroy_rwq_ind_table), 152);
SAME(offsetof(struct verbs_context, create_rwq_ind_table), 160);
SAME(offsetof(struct verbs_context, destroy_wq), 168);
SAME(offsetof(struct verbs_context, modify_wq), 176);
SAME(offsetof(struct verbs_context, create_wq), 184);
SAME(offsetof(struct verbs_context, query_rt_values), 192);
SAME(offsetof(struct verbs_context, create_cq_ex), 200);
SAME(offsetof(struct verbs_context, query_device_ex), 216);
SAME(offsetof(struct verbs_context, ibv_destroy_flow), 224);
SAME(offsetof(struct verbs_context, ABI_placeholder2), 232);
SAME(offsetof(struct verbs_context, ibv_create_flow), 240);
SAME(offsetof(struct verbs_context, ABI_placeholder1), 248);
SAME(offsetof(struct verbs_context, open_qp), 256);
SAME(offsetof(struct verbs_context, create_qp_ex), 264);
SAME(offsetof(struct verbs_context, get_srq_num), 272);
SAME(offsetof(struct verbs_context, create_srq_ex), 280);
SAME(offsetof(struct verbs_context, open_xrcd), 288);
SAME(offsetof(struct verbs_context, close_xrcd), 296);
SAME(offsetof(struct verbs_context, priv), 208);
SAME(offsetof(struct verbs_context, _ABI_placeholder3), 304);
SAME(offsetof(struct verbs_context, sz), 312);
SAME(offsetof(struct verbs_context, context), 320);
SAME(sizeof(struct verbs_context), 648);

/* libibverbs/driver.h and kern-abi.h (private, IBVERBS_PRIVATE_34) */
SAME(offsetof(struct verbs_device_ops, match_device), 32);
SAME(offsetof(struct verbs_device_ops, alloc_context), 40);
SAME(offsetof(struct verbs_device_ops, import_context), 48);
SAME(offsetof(struct verbs_device_ops, alloc_device), 56);
SAME(offsetof(struct verbs_device_ops, uninit_device), 64);
SAME(offsetof(struct verbs_device_ops, name), 0);
SAME(offsetof(struct verbs_device_ops, match_min_abi_version), 8);
SAME(offsetof(struct verbs_device_ops, match_max_abi_version), 12);
SAME(offsetof(struct verbs_device_ops, match_table), 16);
SAME(sizeof(struct verbs_device_ops), 72);
SAME(offsetof(struct verbs_context_ops, advise_mr), 0);
SAME(offsetof(struct verbs_context_ops, alloc_dm), 8);
SAME(offsetof(struct verbs_context_ops, alloc_mw), 16);
SAME(offsetof(struct verbs_context_ops, alloc_null_mr), 24);
SAME(offsetof(struct verbs_context_ops, alloc_parent_domain), 32);
SAME(offsetof(struct verbs_context_ops, alloc_pd), 40);
SAME(offsetof(struct verbs_context_ops, alloc_td), 48);
SAME(offsetof(struct verbs_context_ops, async_event), 56);
SAME(offsetof(struct verbs_context_ops, attach_counters_point_flow), 64);
SAME(offsetof(struct verbs_context_ops, attach_mcast), 72);
SAME(offsetof(struct verbs_context_ops, bind_mw), 80);
SAME(offsetof(struct verbs_context_ops, close_xrcd), 88);
SAME(offsetof(struct verbs_context_ops, cq_event), 96);
SAME(offsetof(struct verbs_context_ops, create_ah), 104);
SAME(offsetof(struct verbs_context_ops, create_counters), 112);
SAME(offsetof(struct verbs_context_ops, create_cq), 120);
SAME(offsetof(struct verbs_context_ops, create_cq_ex), 128);
SAME(offsetof(struct verbs_context_ops, create_flow), 136);
SAME(offsetof(struct verbs_context_ops, create_flow_action_esp), 144);
SAME(offsetof(struct verbs_context_ops, create_qp), 152);
SAME(offsetof(struct verbs_context_ops, create_qp_ex), 160);
SAME(offsetof(struct verbs_context_ops, create_rwq_ind_table), 168);
SAME(offsetof(struct verbs_context_ops, create_srq), 176);
SAME(offsetof(struct verbs_context_ops, create_srq_ex), 184);
SAME(offsetof(struct verbs_context_ops, create_wq), 192);
SAME(offsetof(struct verbs_context_ops, dealloc_mw), 200);
SAME(offsetof(struct verbs_context_ops, dealloc_pd), 208);
SAME(offsetof(struct verbs_context_ops, dealloc_td), 216);
SAME(offsetof(struct verbs_context_ops, dereg_mr), 224);
SAME(offsetof(struct verbs_context_ops, destroy_ah), 232);
SAME(offsetof(struct verbs_context_ops, destroy_counters), 240);
SAME(offsetof(struct verbs_context_ops, destroy_cq), 248);
SAME(offsetof(struct verbs_context_ops, destroy_flow), 256);
SAME(offsetof(struct verbs_context_ops, destroy_flow_action), 264);
SAME(offsetof(struct verbs_context_ops, destroy_qp), 272);
SAME(offsetof(struct verbs_context_ops, destroy_rwq_ind_table), 280);
SAME(offsetof(struct verbs_context_ops, destroy_srq), 288);
SAME(offsetof(struct verbs_context_ops, destroy_wq), 296);
SAME(offsetof(struct verbs_context_ops, detach_mcast), 304);
SAME(offsetof(struct verbs_context_ops, free_context), 312);
SAME(offsetof(struct verbs_context_ops, free_dm), 320);
SAME(offsetof(struct verbs_context_ops, get_srq_num), 328);
SAME(offsetof(struct verbs_context_ops, import_dm), 336);
SAME(offsetof(struct verbs_context_ops, import_mr), 344);
SAME(offsetof(struct verbs_context_ops, import_pd), 352);
SAME(offsetof(struct verbs_context_ops, modify_cq), 360);
SAME(offsetof(struct verbs_context_ops, modify_flow_action_esp), 368);
SAME(offsetof(struct verbs_context_ops, modify_qp), 376);
SAME(offsetof(struct verbs_context_ops, modify_qp_rate_limit), 384);
SAME(offsetof(struct verbs_context_ops, modify_srq), 392);
SAME(offsetof(struct verbs_context_ops, modify_wq), 400);
SAME(offsetof(struct verbs_context_ops, open_qp), 408);
SAME(offsetof(struct verbs_context_ops, open_xrcd), 416);
SAME(offsetof(struct verbs_context_ops, poll_cq), 424);
SAME(offsetof(struct verbs_context_ops, post_recv), 432);
SAME(offsetof(struct verbs_context_ops, post_send), 440);
SAME(offsetof(struct verbs_context_ops, post_srq_ops), 448);
SAME(offsetof(struct verbs_context_ops, post_srq_recv), 456);
SAME(offsetof(struct verbs_context_ops, query_device_ex), 464);
SAME(offsetof(struct verbs_context_ops, query_ece), 472);
SAME(offsetof(struct verbs_context_ops, query_port), 480);
SAME(offsetof(struct verbs_context_ops, query_qp), 488);
SAME(offsetof(struct verbs_context_ops, query_qp_data_in_order), 496);
SAME(offsetof(struct verbs_context_ops, query_rt_values), 504);
SAME(offsetof(struct verbs_context_ops, query_srq), 512);
SAME(offsetof(struct verbs_context_ops, read_counters), 520);
SAME(offsetof(struct verbs_context_ops, reg_dm_mr), 528);
SAME(offsetof(struct verbs_context_ops, reg_dmabuf_mr), 536);
SAME(offsetof(struct verbs_context_ops, reg_mr), 544);
SAME(offsetof(struct verbs_context_ops, req_notify_cq), 552);
SAME(offsetof(struct verbs_context_ops, rereg_mr), 560);
SAME(offsetof(struct verbs_context_ops, resize_cq), 568);
SAME(offsetof(struct verbs_context_ops, set_ece), 576);
SAME(offsetof(struct verbs_context_ops, unimport_dm), 584);
SAME(offsetof(struct verbs_context_ops, unimport_mr), 592);
SAME(offsetof(struct verbs_context_ops, unimport_pd), 600);
SAME(sizeof(struct verbs_context_ops), 608);
SAME(sizeof(struct verbs_match_ent), 24);
SAME(offsetof(struct verbs_match_ent, driver_data), 0);
SAME(offsetof(struct verbs_match_ent, u.modalias), 8);
SAME(offsetof(struct verbs_match_ent, vendor), 16);
SAME(offsetof(struct verbs_match_ent, device), 18);
SAME(offsetof(struct verbs_match_ent, kind), 20);
SAME(sizeof(struct verbs_device), 712);
SAME(offsetof(struct verbs_device, device), 0);
SAME(offsetof(struct verbs_device, ops), 664);
SAME(offsetof(struct verbs_device, refcount), 672);
SAME(offsetof(struct verbs_device, entry), 680);
SAME(offsetof(struct verbs_device, sysfs), 696);
SAME(offsetof(struct verbs_device, core_support), 704);
SAME(sizeof(struct verbs_mr), 56);
SAME(offsetof(struct verbs_mr, ibv_mr), 0);
SAME(offsetof(struct verbs_mr, mr_type), 48);
SAME(offsetof(struct verbs_mr, access), 52);
SAME(sizeof(struct verbs_cq), 288);
SAME(offsetof(struct verbs_cq, cq), 0);
SAME(offsetof(struct verbs_cq, cq_ex), 0);
SAME(offsetof(struct verbs_qp, qp), 0);
SAME(offsetof(struct verbs_qp, qp_ex), 0);
SAME(sizeof(struct ibv_get_context), 16);
SAME(offsetof(struct ibv_get_context, hdr), 0);
SAME(sizeof(struct ibv_alloc_pd), 16);
SAME(offsetof(struct ibv_alloc_pd, hdr), 0);
SAME(sizeof(struct ibv_create_cq), 40);
SAME(offsetof(struct ibv_create_cq, hdr), 0);
SAME(offsetof(struct ibv_create_cq, user_handle), 16);
SAME(offsetof(struct ibv_create_cq, cqe), 24);
SAME(offsetof(struct ibv_create_cq, comp_vector), 28);
SAME(offsetof(struct ibv_create_cq, comp_channel), 32);
SAME(sizeof(struct ibv_create_qp), 64);
SAME(offsetof(struct ibv_create_qp, hdr), 0);
SAME(offsetof(struct ibv_create_qp, user_handle), 16);
SAME(offsetof(struct ibv_create_qp, pd_handle), 24);
SAME(offsetof(struct ibv_create_qp, send_cq_handle), 28);
SAME(offsetof(struct ibv_create_qp, recv_cq_handle), 32);
SAME(offsetof(struct ibv_create_qp, srq_handle), 36);
SAME(offsetof(struct ibv_create_qp, max_send_wr), 40);
SAME(offsetof(struct ibv_create_qp, max_recv_wr), 44);
SAME(offsetof(struct ibv_create_qp, max_send_sge), 48);
SAME(offsetof(struct ibv_create_qp, max_recv_sge), 52);
SAME(offsetof(struct ibv_create_qp, max_inline_data), 56);
SAME(offsetof(struct ibv_create_qp, sq_sig_all), 60);
SAME(offsetof(struct ibv_create_qp, qp_type), 61);
SAME(offsetof(struct ibv_create_qp, is_srq), 62);
SAME(sizeof(struct ibv_reg_mr), 48);
SAME(offsetof(struct ibv_reg_mr, hdr), 0);
SAME(offsetof(struct ibv_reg_mr, start), 16);
SAME(offsetof(struct ibv_reg_mr, length), 24);
SAME(offsetof(struct ibv_reg_mr, hca_va), 32);
SAME(offsetof(struct ibv_reg_mr, pd_handle), 40);
SAME(offsetof(struct ibv_reg_mr, access_flags), 44);
SAME(sizeof(struct ibv_query_port), 24);
SAME(offsetof(struct ibv_query_port, hdr), 0);
SAME(offsetof(struct ibv_query_port, port_num), 16);
SAME(sizeof(struct ibv_query_qp), 24);
SAME(offsetof(struct ibv_query_qp, hdr), 0);
SAME(offsetof(struct ibv_query_qp, qp_handle), 16);
SAME(offsetof(struct ibv_query_qp, attr_mask), 20);
SAME(sizeof(struct ibv_modify_qp), 120);
SAME(offsetof(struct ibv_modify_qp, hdr), 0);
SAME(sizeof(struct ib_uverbs_get_context_resp), 8);
SAME(offsetof(struct ib_uverbs_get_context_resp, async_fd), 0);
SAME(offsetof(struct ib_uverbs_get_context_resp, num_comp_vectors), 4);
SAME(sizeof(struct ib_uverbs_create_cq_resp), 8);
SAME(offsetof(struct ib_uverbs_create_cq_resp, cq_handle), 0);
SAME(offsetof(struct ib_uverbs_create_cq_resp, cqe), 4);
SAME(sizeof(struct ib_uverbs_create_qp_resp), 32);
SAME(offsetof(struct ib_uverbs_create_qp_resp, qp_handle), 0);
SAME(offsetof(struct ib_uverbs_create_qp_resp, qpn), 4);
SAME(offsetof(struct ib_uverbs_create_qp_resp, max_send_wr), 8);
SAME(offsetof(struct ib_uverbs_create_qp_resp, max_recv_wr), 12);
SAME(offsetof(struct ib_uverbs_create_qp_resp, max_send_sge), 16);
SAME(offsetof(struct ib_uverbs_create_qp_resp, max_recv_sge), 20);
SAME(offsetof(struct ib_uverbs_create_qp_resp, max_inline_data), 24);
SAME(sizeof(struct ib_uverbs_alloc_pd_resp), 4);
SAME(offsetof(struct ib_uverbs_alloc_pd_resp, pd_handle), 0);
SAME(sizeof(struct ib_uverbs_reg_mr_resp), 12);
SAME(offsetof(struct ib_uverbs_reg_mr_resp, mr_handle), 0);
SAME(offsetof(struct ib_uverbs_reg_mr_resp, lkey), 4);
SAME(offsetof(struct ib_uverbs_reg_mr_resp, rkey), 8);
SAME(sizeof(struct ib_uverbs_create_ah_resp), 4);
SAME(offsetof(struct ib_uverbs_create_ah_resp, ah_handle), 0);
SAME(sizeof(struct ib_uverbs_ex_query_device_resp), 304);
SAME(offsetof(struct ib_uverbs_ex_query_device_resp, base), 0);
SAME(offsetof(struct ib_uverbs_ex_query_device_resp, comp_mask), 176);
SAME(offsetof(struct ib_uverbs_ex_query_device_resp, response_length), 180);
SAME(offsetof(struct ib_uverbs_ex_query_device_resp, odp_caps), 184);
SAME(offsetof(struct ib_uverbs_ex_query_device_resp, timestamp_mask), 208);
SAME(offsetof(struct ib_uverbs_ex_query_device_resp, hca_core_clock), 216);
SAME(offsetof(struct ib_uverbs_ex_query_device_resp, device_cap_flags_ex), 224);

/*
 * Shared receive queues, UD and address handles (issue 27), measured the
 * same way against v44.0's verbs.h and driver.h: the provider's
 * verbs_srq, the SRQ commands it builds and the work-request and
 * work-completion fields UD uses.
 */
SAME(sizeof(struct ibv_srq), 128);
SAME(offsetof(struct ibv_srq, context), 0);
SAME(offsetof(struct ibv_srq, srq_context), 8);
SAME(offsetof(struct ibv_srq, pd), 16);
SAME(offsetof(struct ibv_srq, handle), 24);
SAME(offsetof(struct ibv_srq, mutex), 32);
SAME(offsetof(struct ibv_srq, cond), 72);
SAME(offsetof(struct ibv_srq, events_completed), 120);
SAME(sizeof(struct ibv_srq_attr), 12);
SAME(offsetof(struct ibv_srq_attr, max_wr), 0);
SAME(offsetof(struct ibv_srq_attr, max_sge), 4);
SAME(offsetof(struct ibv_srq_attr, srq_limit), 8);
SAME(sizeof(struct ibv_srq_init_attr), 24);
SAME(offsetof(struct ibv_srq_init_attr, srq_context), 0);
SAME(offsetof(struct ibv_srq_init_attr, attr), 8);
SAME(sizeof(struct verbs_srq), 160);
SAME(offsetof(struct verbs_srq, srq), 0);
SAME(offsetof(struct verbs_srq, srq_type), 128);
SAME(offsetof(struct verbs_srq, xrcd), 136);
SAME(offsetof(struct verbs_srq, cq), 144);
SAME(offsetof(struct verbs_srq, srq_num), 152);
SAME(sizeof(struct ibv_create_srq), 40);
SAME(sizeof(struct ibv_modify_srq), 24);
SAME(sizeof(struct ibv_query_srq), 24);
SAME(sizeof(struct ib_uverbs_create_srq_resp), 16);
SAME(offsetof(struct ib_uverbs_create_srq_resp, srq_handle), 0);
SAME(offsetof(struct ib_uverbs_create_srq_resp, max_wr), 4);
SAME(offsetof(struct ib_uverbs_create_srq_resp, max_sge), 8);
SAME(offsetof(struct ib_uverbs_create_srq_resp, srqn), 12);
SAME(sizeof(struct ibv_send_wr), 128);
SAME(offsetof(struct ibv_send_wr, wr), 40);
SAME(offsetof(struct ibv_send_wr, wr.ud.ah), 40);
SAME(offsetof(struct ibv_send_wr, wr.ud.remote_qpn), 48);
SAME(offsetof(struct ibv_send_wr, wr.ud.remote_qkey), 52);
SAME(offsetof(struct ibv_send_wr, qp_type), 72);
SAME(sizeof(struct ibv_wc), 48);
SAME(offsetof(struct ibv_wc, src_qp), 32);
SAME(offsetof(struct ibv_wc, wc_flags), 36);
SAME(offsetof(struct ibv_wc, pkey_index), 40);

/*
 * Known differences, 44.0 -> 56.1:
 *
 * 1. struct ibv_qp_ex gained wr_flush at its end (352 -> 360 bytes), so in
 *    struct verbs_qp comp_mask moved from 352 to 360 and xrcd from 360 to
 *    368. The provider allocates its verbs_qp (calloc, 56.1 layout) and
 *    creates it with ibv_cmd_create_qp, which writes neither field.
 *    libibverbs 44.0 reads comp_mask at offset 352 (ibv_qp_to_qp_ex): that is
 *    wr_flush here, inside the allocation and zero, so an ordinary QP reads
 *    "no VERBS_QP_EX". A QP made with send_ops_flags (vrdma_ex.c,
 *    vrdma_mark_qp_ex) gets VERBS_QP_EX in 56.1's field and, when the loaded
 *    library's ibv_qp_to_qp_ex still answers NULL (44.0), at offset 352 too;
 *    44.0 programs have no wr_flush, and 44.0 never reads xrcd (offset 360)
 *    without VERBS_QP_XRCD. Everything 44.0 may touch lies inside the
 *    allocation because the 56.1 struct is larger.
 */
static_assert(offsetof(struct ibv_qp_ex, wr_flush) == 352,
	      "44.0's verbs_qp.comp_mask must fall on 56.1's (unused, zeroed) wr_flush");
static_assert(sizeof(struct verbs_qp) >= 368,
	      "the provider's verbs_qp must cover 44.0's");
/*
 * 2. struct ibv_port_attr gained active_speed_ex (52 -> 56 bytes). The
 *    provider never touches a port attribute itself: it passes libibverbs'
 *    buffer to libibverbs' own ibv_cmd_query_port, which writes the 44.0
 *    layout.
 */
static_assert(offsetof(struct ibv_port_attr, active_speed_ex) == 52,
	      "56.1 only appended to ibv_port_attr (44.0's size is 52)");
/*
 * 3. Prototypes: ibv_cmd_reg_dmabuf_mr gained an argument, and
 *    ibv_cmd_create_cq_ex2, ibv_wr_opcode_str are new in 56.1 (not exported
 *    by 44.0). The provider uses none of them; the Go test checks every
 *    symbol it imports against Debian 12's libibverbs.so.1.
 */

/*
 * The driver's part of a uverbs command or response starts right after
 * the core structure: that is where the kernel's udata begins (the core
 * sizes are the kernel's uapi, stable). DECLARE_DRV_CMD lays it out so;
 * these hold it for the responses the kernel driver writes into.
 */
static_assert(offsetof(struct vrdma_ucmd_create_srq, drv_payload) ==
	      sizeof(struct ibv_create_srq), "create_srq udata in");
static_assert(offsetof(struct vrdma_ucmd_create_srq_resp, drv_payload) ==
	      sizeof(struct ib_uverbs_create_srq_resp), "create_srq udata out");
static_assert(offsetof(struct vrdma_ucmd_create_ah_resp, drv_payload) ==
	      sizeof(struct ib_uverbs_create_ah_resp), "create_ah udata out");
static_assert(offsetof(struct vrdma_ucmd_create_qp_resp, drv_payload) ==
	      sizeof(struct ib_uverbs_create_qp_resp), "create_qp udata out");
