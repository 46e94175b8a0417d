/* Mesh resolution with MaxText's -1 filling and its error messages. */
#include <string.h>

#include "base/err.h"
#include "check.h"
#include "comm/mesh.h"

static st_config cfg(int64_t id, int64_t if_, int64_t it, int64_t dd, int64_t df, int64_t dt)
{
	st_config c;
	memset(&c, 0, sizeof(c));
	c.ici_data_parallelism = id;
	c.ici_fsdp_parallelism = if_;
	c.ici_tensor_parallelism = it;
	c.dcn_data_parallelism = dd;
	c.dcn_fsdp_parallelism = df;
	c.dcn_tensor_parallelism = dt;
	return c;
}

static void expect_error(st_config c, int64_t slices, int64_t dps, const char *msg)
{
	st_mesh m;
	int rc = st_mesh_resolve(&m, &c, slices, dps);
	CHECK(rc == ST_EINVAL);
	CHECK_MSG(strstr(st_errmsg(), msg) != NULL, "got '%s', want '%s'", st_errmsg(), msg);
}

int main(void)
{
	st_mesh m;
	/* MaxText's defaults: ici_fsdp -1, dcn_data -1 */
	st_config c = cfg(1, -1, 1, -1, 1, 1);
	CHECK(st_mesh_resolve(&m, &c, 1, 1) == 0 && m.size[ST_AXIS_FSDP] == 1 && m.size[ST_AXIS_DATA] == 1);
	CHECK(st_mesh_resolve(&m, &c, 2, 4) == 0);
	CHECK(m.ici[ST_AXIS_FSDP] == 4 && m.dcn[ST_AXIS_DATA] == 2 && m.size[ST_AXIS_DATA] == 2);
	/* the tutorial's 70B mesh: 2 slices x 16 devices */
	c = cfg(1, 4, 4, 1, 2, 1);
	CHECK(st_mesh_resolve(&m, &c, 2, 16) == 0 && m.size[ST_AXIS_FSDP] == 8 && m.size[ST_AXIS_TENSOR] == 4);
	/* one slice: DCN values are ignored */
	c = cfg(1, 2, 1, 7, 3, 1);
	CHECK(st_mesh_resolve(&m, &c, 1, 2) == 0 && m.dcn[ST_AXIS_DATA] == 1 && m.dcn[ST_AXIS_FSDP] == 1);
	/* errors */
	expect_error(cfg(-1, -1, 1, 1, 1, 1), 1, 4, "Found unspecified values (-1) for more than one ICI parallelism axis");
	expect_error(cfg(1, 1, 1, -1, -1, 1), 2, 1, "Found unspecified values (-1) for more than one DCN parallelism axis");
	expect_error(cfg(1, -1, 3, 1, 1, 1), 1, 4, "Unspecified value unable to be determined with the given ICI parallelism values");
	expect_error(cfg(1, 4, 4, -1, 1, 1), 1, 1, "Number of devices per slice 1 does not match the product of the ICI parallelism 16");
	expect_error(cfg(1, 2, 1, 1, 1, 1), 2, 2, "Number of slices 2 does not match the product of the DCN parallelism 1");
	expect_error(cfg(1, 0, 1, 1, 1, 1), 1, 1, "ICI parallelism values must be -1 or at least 1");
	return check_result();
}
