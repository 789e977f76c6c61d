-- index ix_cooldowns_until
CREATE INDEX ix_cooldowns_until ON cooldowns (until_ms);

-- index ix_notices_last
CREATE INDEX ix_notices_last ON notices (last_ms);

-- index ix_reservations_created
CREATE INDEX ix_reservations_created ON reservations (created_ms, cost_micro);

-- index ix_reservations_model
CREATE INDEX ix_reservations_model ON reservations (model_key, created_ms);

-- index ix_reservations_open
CREATE INDEX ix_reservations_open ON reservations (status, deadline_ms);

-- index ix_reservations_source
CREATE INDEX ix_reservations_source ON reservations (source_id, status);

-- index ix_sources_claim
CREATE INDEX ix_sources_claim ON sources (in_queue, state, retry_at_ms, last_checked_ms);

-- index ix_transport_strikes_model
CREATE INDEX ix_transport_strikes_model ON transport_strikes (model_key, at_ms);

-- table alembic_version
CREATE TABLE alembic_version (
	version_num VARCHAR(32) NOT NULL, 
	CONSTRAINT alembic_version_pkc PRIMARY KEY (version_num)
);

-- table clock
CREATE TABLE clock (
	id INTEGER NOT NULL, 
	newest_ms BIGINT NOT NULL, 
	CONSTRAINT pk_clock PRIMARY KEY (id), 
	CONSTRAINT ck_clock_single_row CHECK (id = 1)
);

-- table cooldowns
CREATE TABLE cooldowns (
	scope VARCHAR(16) NOT NULL, 
	target VARCHAR(300) NOT NULL, 
	origin VARCHAR(16) NOT NULL, 
	until_ms BIGINT NOT NULL, 
	kind VARCHAR(32) NOT NULL, 
	reason VARCHAR(200), 
	created_ms BIGINT NOT NULL, 
	CONSTRAINT pk_cooldowns PRIMARY KEY (scope, target, origin), 
	CONSTRAINT ck_cooldowns_origin CHECK (origin IN ('policy', 'manual', 'hint')), 
	CONSTRAINT ck_cooldowns_scope CHECK (scope IN ('provider', 'model'))
);

-- table cost_hours
CREATE TABLE cost_hours (
	hour_start_ms BIGINT NOT NULL, 
	cost_micro BIGINT NOT NULL, 
	attempts INTEGER NOT NULL, 
	CONSTRAINT pk_cost_hours PRIMARY KEY (hour_start_ms), 
	CONSTRAINT ck_cost_hours_hour_aligned CHECK (hour_start_ms % 3600000 = 0)
);

-- table daily_totals
CREATE TABLE daily_totals (
	day VARCHAR(10) NOT NULL, 
	model_key VARCHAR(300) NOT NULL, 
	attempts INTEGER NOT NULL, 
	succeeded INTEGER NOT NULL, 
	failed INTEGER NOT NULL, 
	cancelled INTEGER NOT NULL, 
	expired INTEGER NOT NULL, 
	input_tokens BIGINT NOT NULL, 
	output_tokens BIGINT NOT NULL, 
	cost_micro BIGINT NOT NULL, 
	unknown_cost INTEGER NOT NULL, 
	CONSTRAINT pk_daily_totals PRIMARY KEY (day, model_key)
);

-- table meta
CREATE TABLE meta (
	"key" VARCHAR(64) NOT NULL, 
	value VARCHAR(200) NOT NULL, 
	CONSTRAINT pk_meta PRIMARY KEY ("key")
);

-- table notices
CREATE TABLE notices (
	id INTEGER NOT NULL, 
	dedup_key VARCHAR(700) NOT NULL, 
	category VARCHAR(16) NOT NULL, 
	message VARCHAR(500) NOT NULL, 
	source_id VARCHAR(200), 
	first_ms BIGINT NOT NULL, 
	last_ms BIGINT NOT NULL, 
	count INTEGER DEFAULT 1 NOT NULL, 
	CONSTRAINT pk_notices PRIMARY KEY (id), 
	CONSTRAINT uq_notices_dedup_key UNIQUE (dedup_key)
);

-- table reservations
CREATE TABLE reservations (
	id INTEGER NOT NULL, 
	request_id VARCHAR(200), 
	source_id VARCHAR(200) NOT NULL, 
	model_key VARCHAR(300) NOT NULL, 
	provider VARCHAR(100) NOT NULL, 
	role VARCHAR(16) NOT NULL, 
	fallback_from VARCHAR(300), 
	created_ms BIGINT NOT NULL, 
	deadline_ms BIGINT NOT NULL, 
	input_bytes BIGINT NOT NULL, 
	estimate_micro BIGINT, 
	status VARCHAR(16) NOT NULL, 
	settled_ms BIGINT, 
	duration_ms BIGINT, 
	kind VARCHAR(32), 
	subkind VARCHAR(64), 
	reason VARCHAR(64), 
	late BOOLEAN DEFAULT 0 NOT NULL, 
	side_effects BOOLEAN DEFAULT 0 NOT NULL, 
	input_tokens BIGINT, 
	output_tokens BIGINT, 
	actual_micro BIGINT, 
	cost_micro BIGINT, 
	policy_fp VARCHAR(16) NOT NULL, 
	CONSTRAINT pk_reservations PRIMARY KEY (id), 
	CONSTRAINT ck_reservations_status CHECK (status IN ('open', 'succeeded', 'failed', 'cancelled', 'expired')), 
	CONSTRAINT fk_reservations_source_id_sources FOREIGN KEY(source_id) REFERENCES sources (id), 
	CONSTRAINT uq_reservations_request_id UNIQUE (request_id)
);

-- table source_models
CREATE TABLE source_models (
	source_id VARCHAR(200) NOT NULL, 
	model_key VARCHAR(300) NOT NULL, 
	first_ms BIGINT NOT NULL, 
	CONSTRAINT pk_source_models PRIMARY KEY (source_id, model_key), 
	CONSTRAINT fk_source_models_source_id_sources FOREIGN KEY(source_id) REFERENCES sources (id)
);

-- table sources
CREATE TABLE sources (
	id VARCHAR(200) NOT NULL, 
	payload_ref VARCHAR(1000), 
	state VARCHAR(16) NOT NULL, 
	in_queue BOOLEAN DEFAULT 0 NOT NULL, 
	created_ms BIGINT NOT NULL, 
	last_checked_ms BIGINT NOT NULL, 
	retry_at_ms BIGINT, 
	lease_owner VARCHAR(200), 
	lease_expires_ms BIGINT, 
	failures INTEGER DEFAULT 0 NOT NULL, 
	output_failures INTEGER DEFAULT 0 NOT NULL, 
	backoff_steps INTEGER DEFAULT 0 NOT NULL, 
	correction_used BOOLEAN DEFAULT 0 NOT NULL, 
	correction_reason VARCHAR(64), 
	pause_reason VARCHAR(100), 
	finished_ms BIGINT, 
	archived_calls INTEGER DEFAULT 0 NOT NULL, 
	archived_time_ms BIGINT DEFAULT 0 NOT NULL, 
	CONSTRAINT pk_sources PRIMARY KEY (id), 
	CONSTRAINT ck_sources_state CHECK (state IN ('queued', 'leased', 'done', 'paused'))
);

-- table transport_strikes
CREATE TABLE transport_strikes (
	id INTEGER NOT NULL, 
	model_key VARCHAR(300) NOT NULL, 
	at_ms BIGINT NOT NULL, 
	CONSTRAINT pk_transport_strikes PRIMARY KEY (id)
);
