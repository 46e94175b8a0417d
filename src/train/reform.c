/*
 * reform.c - re-forming an elastic group in place (docs/elastic.md,
 * "Re-forming in place"): after a peer's failure, or at a step boundary the
 * group agreed on when a slice comes back, each worker leaves its group,
 * joins the agent's new generation with its state in memory, and the
 * processes that hold less (a joiner holds nothing) receive the state from
 * a peer. No checkpoint is read.
 */
#include <stdlib.h>
#include <string.h>

#include "base/clock.h"
#include "base/crc.h"
#include "base/err.h"
#include "train/trainer_int.h"

int trainer_sync_state(trainer *t)
{
	const st_par *p = &t->par;
	int W = p->world, rc;
	if (W < 1)
		return st_fail(ST_EINTERNAL, "state sync: a group of %d processes", W);
	int64_t mine[2] = {t->done, t->sample0 + (t->done - t->step0) * t->G};
	/* one block: every process's (done, next sample), the allgather's counts, the members */
	int64_t *all = malloc((size_t)W * (3 * sizeof(int64_t) + sizeof(int)));
	if (!all)
		return st_fail(ST_ENOMEM, "out of memory");
	int64_t *counts = all + 2 * W;
	int *members = (int *)(counts + W);
	for (int r = 0; r < W; r++)
		counts[r] = 2;
	if ((rc = st_comm_allgather(p->world_comm, mine, all, counts, ST_DTYPE_I64)) < 0)
		goto out;
	int64_t most = -1;
	for (int r = 0; r < W; r++)
		most = all[2 * r] > most ? all[2 * r] : most;
	if (most < 0) {
		rc = st_fail(ST_EINVAL, "no process of the group holds a training state (every one is a joiner)");
		goto out;
	}
	if (t->model.bf16) { /* the kernel plan: a joiner takes the group's */
		int root = 0;
		while (all[2 * root] != most)
			root++;
		st_kplan plan = t->model.kplan;
		if ((rc = st_comm_broadcast(p->world_comm, plan.f32, sizeof(plan.f32), root)) < 0 ||
		    (rc = st_llama_set_kernels(&t->model, &plan)) < 0)
			goto out;
		if (!t->kernels_set) {
			t->kernels_set = 1;
			if ((rc = st_run_ckpt_set_kernels(&t->ckpt, &t->model.kplan)) < 0)
				goto out;
		}
	}
	/* the members of this process's shard: the source first, then the receivers */
	int key = p->coord[ST_AXIS_FSDP] * (int)p->mesh.size[ST_AXIS_TENSOR] + p->coord[ST_AXIS_TENSOR];
	int n = 0, nrecv = 0, me = -1;
	for (int pass = 0; pass < 2; pass++)
		for (int r = 0; r < W; r++) {
			int co[ST_NAXES];
			st_mesh_coords(&p->mesh, r, co);
			if (co[ST_AXIS_FSDP] * (int)p->mesh.size[ST_AXIS_TENSOR] + co[ST_AXIS_TENSOR] != key)
				continue;
			int has = all[2 * r] == most;
			if (pass == 0 && has && n == 0)
				members[n++] = r;
			else if (pass == 1 && !has)
				members[n++] = r, nrecv++;
		}
	for (int i = 0; i < n; i++)
		if (members[i] == p->rank)
			me = i;
	int64_t behind = 0;
	for (int r = 0; r < W; r++)
		behind += all[2 * r] < most;
	if (t->lead && behind)
		st_info("re-formed group: %lld of %d processes receive the state of step %lld from a peer",
			(long long)behind, W, (long long)most);
	if (nrecv == 0 || me < 0) { /* nothing to send or receive for this shard */
		rc = 0;
		if (t->done != most) /* cannot be: a process behind is a receiver */
			rc = st_fail(ST_EINTERNAL, "state sync: rank %d holds step %lld, the group %lld", p->rank,
				     (long long)t->done, (long long)most);
		goto out;
	}
	st_comm *bc;
	if ((rc = st_comm_create(&bc, t->group, n, members)) < 0)
		goto out;
	double t0 = st_mono_s();
	float *blk[3] = {t->shard.p, t->shard.m, t->shard.v};
	size_t bytes = (size_t)t->shard.n * sizeof(float);
	/* header: step, next sample, the three blocks' CRCs */
	int64_t hdr[5] = {most, all[2 * members[0] + 1], 0, 0, 0};
	if (me == 0)
		for (int k = 0; k < 3; k++)
			hdr[2 + k] = st_crc32(0, blk[k], bytes);
	rc = st_comm_broadcast(bc, hdr, sizeof(hdr), 0);
	for (int k = 0; k < 3 && rc == 0; k++)
		rc = st_comm_broadcast(bc, blk[k], bytes, 0);
	st_comm_free(bc);
	if (rc < 0)
		goto out;
	if (me > 0) {
		for (int k = 0; k < 3; k++)
			if ((uint32_t)hdr[2 + k] != st_crc32(0, blk[k], bytes)) {
				rc = st_fail(ST_EIO, "the state received from rank %d fails its checksum (block %d)",
					     members[0], k);
				goto out;
			}
		t->done = t->step0 = hdr[0];
		t->sample0 = hdr[1];
		double secs = st_mono_s() - t0;
		fprintf(stderr, "slicetrain: rank %d: state of step %lld received from rank %d, no checkpoint read: "
			"%.1f MB in %.3f s (%.0f MB/s), checksums match\n", p->rank, (long long)t->done, members[0],
			3e-6 * (double)bytes, secs, 3e-6 * (double)bytes / (secs > 0 ? secs : 1e-9));
		if (t->shard.alias)
			rc = st_llama_weights_changed(&t->model);
	}
out:
	free(all);
	return rc;
}

/*
 * Leave the group, join generation r->gen's with the state in memory, and
 * continue from the completed steps the group holds. Only the DCN data axis
 * may change: this process keeps its fsdp and tensor coordinates, so its
 * shard stays what it is (the controller re-forms in place only then).
 */
static int reform(trainer *t, const st_reform *r, int failed)
{
	double t0 = st_mono_s();
	st_mesh old = t->par.mesh;
	int oc[ST_NAXES];
	memcpy(oc, t->par.coord, sizeof(oc));
	int64_t next = t->sample0 + (t->done - t->step0) * t->G;
	bound_release(t, 1);
	group_release(t);
	t->generation = r->gen;
	t->env.max_devices = r->elastic.max_devices;
	int rc = group_setup(t, &r->env);
	if (rc < 0)
		return rc;
	const st_par *p = &t->par;
	for (int a = ST_AXIS_FSDP; a < ST_NAXES; a++)
		if (p->mesh.size[a] != old.size[a] || p->coord[a] != oc[a])
			return st_fail(ST_EPEER, "re-forming in place: the %s axis changed (%lld -> %lld): a new "
						  "process must restore from a checkpoint", a == ST_AXIS_FSDP ? "fsdp" : "tensor",
				       (long long)old.size[a], (long long)p->mesh.size[a]);
	t->step0 = t->done;
	t->sample0 = next;
	snprintf(t->origin, sizeof(t->origin), "re-formed in place %s, the state kept in memory",
		 failed ? "after a failure" : "at a step boundary");
	if ((rc = bound_setup(t, 1)) < 0)
		return rc;
	double t1 = st_mono_s();
	if ((rc = trainer_sync_state(t)) < 0)
		return rc;
	describe_run(t);
	if (t->lead)
		st_info("re-formed in place (generation %lld, %s): %d processes at step %lld; group %.3f s, state %.3f s",
			r->gen, failed ? "after a failure" : "at a step boundary", p->world, (long long)t->done, t1 - t0,
			st_mono_s() - t1);
	fflush(stdout);
	return st_worker_ctl_ack(t->ctl, r->gen);
}

int trainer_poll_reform(trainer *t)
{
	if (!t->ctl || t->have_pending)
		return 0;
	int rc = st_worker_ctl_wait(t->ctl, 0, &t->pending);
	if (rc < 0 && rc != ST_EPEER) /* a closed channel: the agent says so again if it matters */
		return rc;
	t->have_pending = rc == 1;
	return 0;
}

int64_t trainer_reform(trainer *t, int rc)
{
	int failed = rc < 0;
	st_reform r = t->pending;
	if (failed) {
		if (!t->ctl || (rc != ST_EPEER && rc != ST_EINTR))
			return rc;
		char why[300];
		snprintf(why, sizeof(why), "%s", st_errmsg());
		/* A reform taken at this step boundary (trainer_poll_reform) whose
		 * agreement then failed may be the one the controller sent for this
		 * very failure: it sends no other, so act on it. Were it a grow sent
		 * before the failure, its generation has made no step and the
		 * controller stops it. */
		double t0 = st_mono_s();
		int w = t->have_pending ? 1 : st_worker_ctl_wait(t->ctl, ST_REFORM_WAIT_MS, &r);
		t->have_pending = 0;
		if (w <= 0) {
			st_warn("rank %d: %s; no re-formation came (%s): stopping", t->par.rank, why,
				w == 0 ? "waited 60 s" : st_errmsg());
			return st_fail(rc, "%s", why);
		}
		st_info("rank %d: %s; re-forming as rank %d of %d (generation %lld) after %.3f s", t->par.rank, why,
			r.env.rank, r.env.world_size, r.gen, st_mono_s() - t0);
	} else { /* the group agreed to re-form after this step: every process does */
		if (!t->ctl)
			return st_fail(ST_EPEER, "the group agreed to re-form, but this process has no agent");
		if (!t->have_pending) {
			int w = st_worker_ctl_wait(t->ctl, ST_REFORM_WAIT_MS, &t->pending);
			if (w <= 0)
				return w < 0 ? w : st_fail(ST_EPEER, "the group agreed to re-form, but no reform came");
			r = t->pending;
		}
		t->have_pending = 0;
	}
	if ((rc = reform(t, &r, failed)) < 0)
		return rc;
	return t->done;
}
