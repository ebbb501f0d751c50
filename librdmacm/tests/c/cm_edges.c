/* librdmacm's edges, as an application meets them.
 *
 *   cm_edges server ADDR PORT    listen, print READY, reject the first
 *                                request with private data "go away!"
 *   cm_edges client ADDR PORT    connect with private data "hello"; expect
 *                                RDMA_CM_EVENT_REJECTED, status 28 (consumer
 *                                reject), the server's private data, and the
 *                                QP moved to ERR; and EAGAIN from a
 *                                non-blocking channel with nothing waiting;
 *                                then EINVAL for the destroyed id, used again
 *   cm_edges unreachable SRC ADDR PORT
 *                                connect from SRC to an address no CM answers on;
 *                                expect RDMA_CM_EVENT_UNREACHABLE, status -110
 *   cm_edges acceptor ADDR PORT  listen, accept one request with rnr_retry_count 9,
 *                                wait for ESTABLISHED and the peer's DISCONNECTED
 *   cm_edges retries ADDR PORT   connect with retry_count 15 and rnr_retry_count 12
 *                                (libfabric asks for 15): kernel rdma_cm caps both
 *                                at 7, the width of the CM fields; expect
 *                                ESTABLISHED and a QP with retry_cnt 7 and
 *                                rnr_retry 7, then disconnect
 *   cm_edges nodaemon            rdma_create_event_channel fails with ENODEV;
 *                                rdma_event_str; a stream rsocket fails with
 *                                ENODEV (rstream then says "No RDMA devices
 *                                were detected"); datagram rsockets and
 *                                riomap are ENOSYS
 *
 * Exit 0 and a last line "OK ..." on success; "FAIL: why" and exit 1 else.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <rdma/rdma_cma.h>
#include <rdma/rsocket.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static void fail(const char *why, int e)
{
	printf("FAIL: %s (%d %s)\n", why, e, strerror(e));
	exit(1);
}

static double now(void)
{
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return t.tv_sec + t.tv_nsec / 1e9;
}

static struct sockaddr_in addr_of(const char *ip, const char *port)
{
	struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons(atoi(port))};
	if (inet_pton(AF_INET, ip, &a.sin_addr) != 1)
		fail("bad address", EINVAL);
	return a;
}

/* The next event, which must be `want` (status not checked). */
static struct rdma_cm_event *expect(struct rdma_event_channel *ch, enum rdma_cm_event_type want)
{
	struct rdma_cm_event *ev;
	if (rdma_get_cm_event(ch, &ev))
		fail("rdma_get_cm_event", errno);
	if (ev->event != want) {
		printf("FAIL: got %s status %d, expected %s\n", rdma_event_str(ev->event), ev->status,
		       rdma_event_str(want));
		exit(1);
	}
	return ev;
}

static void server(const char *ip, const char *port)
{
	struct rdma_event_channel *ch = rdma_create_event_channel();
	struct rdma_cm_id *listen_id;
	struct sockaddr_in a = addr_of(ip, port);
	if (!ch)
		fail("rdma_create_event_channel", errno);
	if (rdma_create_id(ch, &listen_id, (void *)0x5151, RDMA_PS_TCP))
		fail("rdma_create_id", errno);
	if (rdma_bind_addr(listen_id, (struct sockaddr *)&a))
		fail("rdma_bind_addr", errno);
	if (ntohs(rdma_get_src_port(listen_id)) != atoi(port))
		fail("rdma_get_src_port", EINVAL);
	if (rdma_listen(listen_id, 4))
		fail("rdma_listen", errno);
	printf("READY\n");
	fflush(stdout);
	struct rdma_cm_event *ev = expect(ch, RDMA_CM_EVENT_CONNECT_REQUEST);
	struct rdma_cm_id *child = ev->id;
	if (ev->listen_id != listen_id || child == listen_id || child->context != (void *)0x5151)
		fail("CONNECT_REQUEST ids/context", EINVAL);
	if (!child->verbs || child->port_num != 1 || child->qp_type != IBV_QPT_RC)
		fail("new id without device/port/qp_type", EINVAL);
	if (ev->param.conn.private_data_len < 5 ||
	    memcmp(ev->param.conn.private_data, "hello", 5))
		fail("request private data", EINVAL);
	struct sockaddr_in *peer = (struct sockaddr_in *)rdma_get_peer_addr(child);
	if (peer->sin_family != AF_INET || peer->sin_addr.s_addr != a.sin_addr.s_addr)
		fail("peer address", EINVAL);
	if (rdma_reject(child, "go away!", 8))
		fail("rdma_reject", errno);
	rdma_ack_cm_event(ev);
	if (rdma_destroy_id(child))
		fail("rdma_destroy_id(child)", errno);
	if (rdma_destroy_id(listen_id))
		fail("rdma_destroy_id(listener)", errno);
	rdma_destroy_event_channel(ch);
	printf("OK server rejected\n");
}

static struct rdma_cm_id *connect_with(struct rdma_event_channel *ch, const char *src,
					const char *ip, const char *port, uint8_t retry,
					uint8_t rnr_retry);

/* Resolve, route and connect with a QP whose CQs the library makes. */
static struct rdma_cm_id *connect_to(struct rdma_event_channel *ch, const char *src,
				      const char *ip, const char *port)
{
	return connect_with(ch, src, ip, port, 7, 7);
}

static void acceptor(const char *ip, const char *port)
{
	struct rdma_event_channel *ch = rdma_create_event_channel();
	struct rdma_cm_id *listen_id;
	struct sockaddr_in a = addr_of(ip, port);
	if (!ch)
		fail("rdma_create_event_channel", errno);
	if (rdma_create_id(ch, &listen_id, NULL, RDMA_PS_TCP) ||
	    rdma_bind_addr(listen_id, (struct sockaddr *)&a) || rdma_listen(listen_id, 4))
		fail("listen", errno);
	printf("READY\n");
	fflush(stdout);
	struct rdma_cm_event *ev = expect(ch, RDMA_CM_EVENT_CONNECT_REQUEST);
	struct rdma_cm_id *child = ev->id;
	if (ev->param.conn.retry_count != 7 || ev->param.conn.rnr_retry_count != 7) {
		printf("FAIL: request carries retry_count %d rnr_retry_count %d, expected 7 7\n",
		       ev->param.conn.retry_count, ev->param.conn.rnr_retry_count);
		exit(1);
	}
	rdma_ack_cm_event(ev);
	struct ibv_qp_init_attr qa = {
		.cap = {.max_send_wr = 4, .max_recv_wr = 4, .max_send_sge = 1, .max_recv_sge = 1},
		.qp_type = IBV_QPT_RC,
	};
	if (rdma_create_qp(child, NULL, &qa))
		fail("rdma_create_qp", errno);
	struct rdma_conn_param cp = {
		.responder_resources = 1, .initiator_depth = 1, .rnr_retry_count = 9,
	};
	if (rdma_accept(child, &cp))
		fail("rdma_accept", errno);
	rdma_ack_cm_event(expect(ch, RDMA_CM_EVENT_ESTABLISHED));
	rdma_ack_cm_event(expect(ch, RDMA_CM_EVENT_DISCONNECTED));
	rdma_disconnect(child);
	rdma_destroy_qp(child);
	rdma_destroy_id(child);
	rdma_destroy_id(listen_id);
	rdma_destroy_event_channel(ch);
	printf("OK acceptor\n");
}

static void retries(const char *ip, const char *port)
{
	struct rdma_event_channel *ch = rdma_create_event_channel();
	if (!ch)
		fail("rdma_create_event_channel", errno);
	struct rdma_cm_id *id = connect_with(ch, NULL, ip, port, 15, 12);
	rdma_ack_cm_event(expect(ch, RDMA_CM_EVENT_ESTABLISHED));
	struct ibv_qp_attr qa;
	struct ibv_qp_init_attr ia;
	if (ibv_query_qp(id->qp, &qa, IBV_QP_STATE | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY, &ia))
		fail("ibv_query_qp", errno);
	if (qa.qp_state != IBV_QPS_RTS || qa.retry_cnt != 7 || qa.rnr_retry != 7) {
		printf("FAIL: QP state %d retry_cnt %d rnr_retry %d, expected RTS 7 7\n", qa.qp_state,
		       qa.retry_cnt, qa.rnr_retry);
		exit(1);
	}
	if (rdma_disconnect(id))
		fail("rdma_disconnect", errno);
	rdma_ack_cm_event(expect(ch, RDMA_CM_EVENT_DISCONNECTED));
	rdma_destroy_qp(id);
	rdma_destroy_id(id);
	rdma_destroy_event_channel(ch);
	printf("OK retries capped at 7\n");
}

static struct rdma_cm_id *connect_with(struct rdma_event_channel *ch, const char *src,
				       const char *ip, const char *port, uint8_t retry,
				       uint8_t rnr_retry)
{
	struct rdma_cm_id *id;
	struct sockaddr_in a = addr_of(ip, port);
	struct sockaddr_in s = addr_of(src ? src : "0.0.0.0", "0");
	if (rdma_create_id(ch, &id, NULL, RDMA_PS_TCP))
		fail("rdma_create_id", errno);
	if (rdma_resolve_addr(id, src ? (struct sockaddr *)&s : NULL, (struct sockaddr *)&a, 2000))
		fail("rdma_resolve_addr", errno);
	rdma_ack_cm_event(expect(ch, RDMA_CM_EVENT_ADDR_RESOLVED));
	if (!id->verbs)
		fail("no device after ADDR_RESOLVED", EINVAL);
	if (rdma_resolve_route(id, 2000))
		fail("rdma_resolve_route", errno);
	rdma_ack_cm_event(expect(ch, RDMA_CM_EVENT_ROUTE_RESOLVED));
	if (id->route.num_paths != 1 || !id->route.path_rec)
		fail("no path record", EINVAL);
	struct ibv_qp_init_attr qa = {
		.cap = {.max_send_wr = 4, .max_recv_wr = 4, .max_send_sge = 1, .max_recv_sge = 1},
		.qp_type = IBV_QPT_RC,
	};
	if (rdma_create_qp(id, NULL, &qa))
		fail("rdma_create_qp", errno);
	if (!id->qp || !id->send_cq || !id->recv_cq || !id->send_cq_channel || !id->pd)
		fail("rdma_create_qp left the id without QP/CQs/PD", EINVAL);
	struct rdma_conn_param cp = {
		.private_data = "hello", .private_data_len = 5,
		.responder_resources = 1, .initiator_depth = 1, .retry_count = retry,
		.rnr_retry_count = rnr_retry,
	};
	if (rdma_connect(id, &cp))
		fail("rdma_connect", errno);
	return id;
}

static void client(const char *ip, const char *port)
{
	struct rdma_event_channel *ch = rdma_create_event_channel();
	if (!ch)
		fail("rdma_create_event_channel", errno);
	/* Non-blocking channel with nothing waiting: EAGAIN. */
	int fl = fcntl(ch->fd, F_GETFL);
	fcntl(ch->fd, F_SETFL, fl | O_NONBLOCK);
	struct rdma_cm_event *ev;
	if (rdma_get_cm_event(ch, &ev) != -1 || errno != EAGAIN)
		fail("non-blocking rdma_get_cm_event did not fail with EAGAIN", errno);
	fcntl(ch->fd, F_SETFL, fl);

	struct rdma_cm_id *id = connect_to(ch, NULL, ip, port);
	ev = expect(ch, RDMA_CM_EVENT_REJECTED);
	if (ev->status != 28) {
		printf("FAIL: REJECTED status %d, expected 28 (consumer reject)\n", ev->status);
		exit(1);
	}
	if (ev->param.conn.private_data_len < 8 || memcmp(ev->param.conn.private_data, "go away!", 8))
		fail("reject private data", EINVAL);
	struct ibv_qp_attr qa;
	struct ibv_qp_init_attr ia;
	if (ibv_query_qp(id->qp, &qa, IBV_QP_STATE, &ia) || qa.qp_state != IBV_QPS_ERR)
		fail("QP not in ERR after REJECTED", EINVAL);
	rdma_ack_cm_event(ev);
	rdma_destroy_qp(id);
	if (rdma_destroy_id(id))
		fail("rdma_destroy_id", errno);
	/* What perftest 25.01 does after a reject: use the id it destroyed.
	 * The library must refuse it (EINVAL), not read freed memory. The
	 * pointer is only compared, never followed, by a correct library. */
	struct sockaddr_in dst = addr_of(ip, port);
	errno = 0;
	if (rdma_resolve_addr(id, NULL, (struct sockaddr *)&dst, 2000) != -1 || errno != EINVAL)
		fail("rdma_resolve_addr on a destroyed id: expected -1 and EINVAL", errno);
	errno = 0;
	if (rdma_destroy_id(id) != -1 || errno != EINVAL)
		fail("rdma_destroy_id twice: expected -1 and EINVAL", errno);
	rdma_destroy_event_channel(ch);
	printf("OK rejected status=28 private_data=\"go away!\", destroyed id refused\n");
}

static void unreachable(const char *src, const char *ip, const char *port)
{
	struct rdma_event_channel *ch = rdma_create_event_channel();
	if (!ch)
		fail("rdma_create_event_channel", errno);
	double t0 = now();
	struct rdma_cm_id *id = connect_to(ch, src, ip, port);
	struct rdma_cm_event *ev = expect(ch, RDMA_CM_EVENT_UNREACHABLE);
	if (ev->status != -ETIMEDOUT) {
		printf("FAIL: UNREACHABLE status %d, expected %d\n", ev->status, -ETIMEDOUT);
		exit(1);
	}
	rdma_ack_cm_event(ev);
	rdma_destroy_qp(id);
	rdma_destroy_id(id);
	rdma_destroy_event_channel(ch);
	printf("OK unreachable status=-110 after %.0f s\n", now() - t0);
}

static void nodaemon(void)
{
	errno = 0;
	if (rdma_create_event_channel() || errno != ENODEV)
		fail("rdma_create_event_channel without a daemon: expected NULL and ENODEV", errno);
	if (strcmp(rdma_event_str(RDMA_CM_EVENT_REJECTED), "RDMA_CM_EVENT_REJECTED") ||
	    strcmp(rdma_event_str(RDMA_CM_EVENT_TIMEWAIT_EXIT), "RDMA_CM_EVENT_TIMEWAIT_EXIT") ||
	    strcmp(rdma_event_str(99), "UNKNOWN EVENT"))
		fail("rdma_event_str", EINVAL);
	errno = 0;
	if (rsocket(AF_INET, SOCK_STREAM, 0) != -1 || errno != ENODEV)
		fail("stream rsocket without a daemon: expected -1 and ENODEV", errno);
	errno = 0;
	if (rsocket(AF_INET, SOCK_DGRAM, 0) != -1 || errno != ENOSYS)
		fail("datagram rsocket is not ENOSYS", errno);
	errno = 0;
	if (riomap(3, NULL, 0, 0, 0, 0) != -1 || errno != ENOSYS)
		fail("riomap is not ENOSYS", errno);
	printf("OK nodaemon ENODEV, event_str, rsocket ENODEV, SOCK_DGRAM and riomap ENOSYS\n");
}

int main(int argc, char **argv)
{
	setvbuf(stdout, NULL, _IOLBF, 0);
	if (argc == 2 && !strcmp(argv[1], "nodaemon"))
		nodaemon();
	else if (argc == 4 && !strcmp(argv[1], "server"))
		server(argv[2], argv[3]);
	else if (argc == 4 && !strcmp(argv[1], "client"))
		client(argv[2], argv[3]);
	else if (argc == 4 && !strcmp(argv[1], "acceptor"))
		acceptor(argv[2], argv[3]);
	else if (argc == 4 && !strcmp(argv[1], "retries"))
		retries(argv[2], argv[3]);
	else if (argc == 5 && !strcmp(argv[1], "unreachable"))
		unreachable(argv[2], argv[3], argv[4]);
	else
		fail("usage: cm_edges server|client|acceptor|retries ADDR PORT | unreachable SRC ADDR "
		     "PORT | nodaemon",
		     EINVAL);
	return 0;
}
